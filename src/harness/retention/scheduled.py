"""The scheduled archive pass of `harness serve` (its housekeeping loop) and of the Celery beat
(task ``harness.archive``): every HARNESS_ARCHIVE_INTERVAL_S, when a retention period is set, one pass
(at most one segment) off the housekeeping thread, since it reads and proves many Runs."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from harness.retention.archiver import Archiver, ArchiveReport
from harness.retention.policy import RetentionPolicy

log = logging.getLogger("harness.archive")

#: an archiver for one pass under the given policy, as the settings describe it (HARNESS_ARCHIVE_URL, the
#: checkpoint directory, the witnesses): harness.wiring.retention.archiver_factory
ArchiverFactory = Callable[[RetentionPolicy], Archiver]


def archive_once(make: ArchiverFactory) -> ArchiveReport | None:
    """One pass when a retention period is set (None when none is); the Celery task's body."""
    policy = RetentionPolicy.from_env()
    if policy.days is None and all(d is None for d in policy.tenants.values()):
        return None
    report = make(policy).run()
    if report.runs:
        log.info("archived %d Run(s) to %s, pruned %d", report.runs, report.location, report.pruned_runs)
    return report


class ScheduledArchiver:
    """Starts an archive pass in the background when one is due; one at a time per process."""

    def __init__(self, make: ArchiverFactory, interval_s: float | None = None) -> None:
        self.make = make
        self.interval_s = RetentionPolicy.from_env().interval_s if interval_s is None else interval_s
        self._next = time.monotonic() + self.interval_s
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self.pending: Future[ArchiveReport | None] | None = None

    def start_if_due(self) -> None:
        """Start a pass when the interval has passed and none is running."""
        if self.interval_s <= 0 or time.monotonic() < self._next:
            return
        with self._lock:
            if self.pending is not None and not self.pending.done():
                return
            self._next = time.monotonic() + self.interval_s
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix="harness-archive")
            self.pending = self._pool.submit(self._pass)

    def _pass(self) -> ArchiveReport | None:
        try:
            return archive_once(self.make)
        except Exception:  # the service goes on; the next interval tries again
            log.exception("archive pass failed")
            return None

    def close(self) -> None:
        """Wait for a running pass and stop."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
