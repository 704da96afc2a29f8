"""The port where archive segments are kept (SPEC A6): immutable named blobs, and the error they raise.

A segment is written once and never replaced: `put` refuses a name that exists. The local-directory
store is harness.retention.storage; the S3-compatible one is harness.adapters.s3_segments, which the
composition root (harness.config) injects where a URL or a location names a bucket.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from harness.domain.errors import HarnessError


class SegmentStoreError(HarnessError):
    """The segment store failed or refused (exists already, unreachable, missing object)."""


class SegmentStore(Protocol):
    """Immutable named blobs."""

    def put(self, name: str, data: bytes) -> str:
        """Store a new segment; returns its location (a URL). Refuses a name that exists."""
        ...

    def get(self, location: str) -> bytes:
        """The bytes of a stored segment."""
        ...

    def delete(self, location: str) -> None:
        """Remove a stored segment (only an erasure does, once its redacted copy is stored)."""
        ...


#: the store that holds the segment at a location (a file:// or s3:// URL, as `put` returned it)
SegmentLocator = Callable[[str], SegmentStore]
#: an S3-compatible segment store: (bucket, key prefix, endpoint URL or None for AWS)
S3Factory = Callable[[str, str, str | None], SegmentStore]
