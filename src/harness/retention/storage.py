"""Where archive segments are kept: the local-directory SegmentStore, and the store a URL names.

A segment is written once and never replaced: `put` refuses a name that exists. `HARNESS_ARCHIVE_URL`
names the store: a directory path (or file://), or s3://bucket/prefix for an S3-compatible bucket
(harness.adapters.s3_segments, on boto3, which the composition root passes in as `s3`:
harness.wiring.retention.open_segment_store; `HARNESS_ARCHIVE_S3_ENDPOINT` points it at a server other than AWS,
credentials come from boto3's usual places).
"""

from __future__ import annotations

import os
from pathlib import Path

from harness.domain.errors import BadInputError
from harness.ports.segments import S3Factory, SegmentStore, SegmentStoreError

URL_ENV = "HARNESS_ARCHIVE_URL"
ENDPOINT_ENV = "HARNESS_ARCHIVE_S3_ENDPOINT"
DEFAULT_DIR = "harness-archive"


class LocalSegmentStore:
    """Segments as read-only files in a directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def put(self, name: str, data: bytes) -> str:
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / name
        try:
            with open(path, "xb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
        except FileExistsError:
            raise SegmentStoreError(f"segment {path} exists already: segments are never replaced") from None
        path.chmod(0o444)
        return path.resolve().as_uri()

    def _path(self, location: str) -> Path:
        return Path(location.removeprefix("file://")) if location.startswith("file://") else self.directory / location

    def get(self, location: str) -> bytes:
        path = self._path(location)
        try:
            return path.read_bytes()
        except OSError as exc:
            raise SegmentStoreError(f"cannot read segment {path}: {exc.strerror}") from None

    def delete(self, location: str) -> None:
        path = self._path(location)
        try:
            path.unlink()
        except OSError as exc:
            raise SegmentStoreError(f"cannot remove segment {path}: {exc.strerror}") from None


def _s3(s3: S3Factory | None, what: str) -> S3Factory:
    if s3 is None:
        raise BadInputError(f"{what}: no S3 segment store is wired here (open it through harness.config)")
    return s3


def open_segment_store(url: str | None = None, endpoint: str | None = None, *,
                       s3: S3Factory | None = None) -> SegmentStore:
    """The store `url` names (default HARNESS_ARCHIVE_URL, else ./harness-archive); an s3:// URL needs `s3`."""
    url = url or os.environ.get(URL_ENV) or DEFAULT_DIR
    if url.startswith("s3://"):
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not bucket:
            raise BadInputError(f"{url}: an S3 archive URL is s3://bucket[/prefix]")
        return _s3(s3, url)(bucket, prefix, endpoint or os.environ.get(ENDPOINT_ENV))
    if "://" in url and not url.startswith("file://"):
        raise BadInputError(f"archive URL {url!r}: give a directory, file:///path or s3://bucket/prefix")
    return LocalSegmentStore(Path(url.removeprefix("file://")).expanduser())


def store_of(location: str, endpoint: str | None = None, *, s3: S3Factory | None = None) -> SegmentStore:
    """The store that holds the segment at `location` (a file:// or s3:// URL, as `put` returned it)."""
    if location.startswith("s3://"):
        bucket = location.removeprefix("s3://").partition("/")[0]
        return _s3(s3, location)(bucket, "", endpoint or os.environ.get(ENDPOINT_ENV))
    return LocalSegmentStore(Path(location.removeprefix("file://")).parent)


def read_location(location: str, endpoint: str | None = None, *, s3: S3Factory | None = None) -> bytes:
    """The bytes of the segment at `location`."""
    return store_of(location, endpoint, s3=s3).get(location)
