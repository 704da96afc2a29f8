"""A worker drives Runs under a lease (SPEC K5b, S1, T6): in-process or as the body of a Celery task.

The lease-fenced drive itself is harness.drive.leased; a RunWorker is one built from a Runtime.
"""

from __future__ import annotations

from harness.config import Runtime, open_leases
from harness.drive.leased import LeasedDrive, default_owner


class RunWorker(LeasedDrive):
    """Drives Runs of one Runtime for one process or thread."""

    def __init__(self, runtime: Runtime, *, owner: str | None = None, ttl_s: float | None = None,
                 max_stalls: int | None = None) -> None:
        super().__init__(runtime.store, runtime.runs, runtime.machine,
                         open_leases(runtime, ttl_s or runtime.settings.lease_ttl_s),
                         owner=owner or default_owner(), max_stalls=max_stalls or runtime.settings.max_stalls)
        self.runtime = runtime
