"""The service's embedded worker (SPEC D1, U2): drives accepted Runs in a bounded thread pool, and a
housekeeping loop applies approval timeouts, sweeps and drains the trace outbox.

Capacity is reserved before a Run is created, so a full worker answers "busy" without leaving an
accepted Run that nobody will drive. Nothing accepted is lost: on start, and at every sweep, the worker
also picks up every Run that should be moving and that nobody drives (no live lease) — Runs accepted or
resumed before this process (or another replica) died. Each drive holds the Run's lease, so several
replicas on one database never drive one Run twice. A Run that raises while being driven stays in its
state and is logged with its run_id; it is picked up again, and the zombie sweeper is the backstop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager

from harness.audit.publisher import CheckpointPublisher
from harness.config import Runtime, archiver_factory, audit_reads
from harness.retention.scheduled import ScheduledArchiver
from harness.service.errors import ApiError
from harness.service.logs import run_context
from harness.sweeper import ZombieSweeper
from harness.worker import RunWorker

log = logging.getLogger("harness.worker")


def _checkpoint_publisher(runtime: Runtime) -> CheckpointPublisher:
    """The service's checkpoint publisher: its first checkpoint one interval after it starts."""
    s = runtime.settings
    return CheckpointPublisher.from_settings(audit_reads(runtime.store), s.checkpoint_interval_s, s.checkpoint_dir,
                                             s.checkpoint_witnesses, wait_first=True)


class Admission:
    """A reserved place in the worker for one new Run."""

    handed_over = False


class EmbeddedWorker:
    """Drives Runs in-process."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        threads: int = 4,
        queue_limit: int = 1000,
        housekeeping_interval_s: float = 1.0,
    ) -> None:
        self.runtime = runtime
        self.threads = threads
        self.queue_limit = queue_limit
        self.interval = housekeeping_interval_s
        self._slots = threading.BoundedSemaphore(queue_limit)
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._stop = threading.Event()
        self._housekeeper: threading.Thread | None = None
        self._in_flight = 0
        self._last_sweep = time.monotonic()
        #: Runs this worker has queued or is driving, so the re-drive does not queue them twice
        self._queued: set[str] = set()
        self.checkpoints = _checkpoint_publisher(runtime)
        #: archives final Runs past the retention period (HARNESS_RETENTION_DAYS) every archive interval
        self.archiver = ScheduledArchiver(archiver_factory(runtime.store, runtime.settings.checkpoint_dir,
                                                           runtime.settings.checkpoint_witnesses))

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the pool and the housekeeping loop (idempotent)."""
        with self._lock:
            if self._pool is not None:
                return
            self._stop.clear()
            self._pool = ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="harness-run")
            self._housekeeper = threading.Thread(
                target=self._housekeeping, name="harness-housekeeping", daemon=True
            )
            self._housekeeper.start()
        self.redrive()  # Runs accepted before a restart are driven, not left to the sweeper

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop taking work, let Runs in flight reach their next stop, and end the loop."""
        with self._lock:
            pool, self._pool = self._pool, None
            housekeeper, self._housekeeper = self._housekeeper, None
        self._stop.set()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)
        if housekeeper is not None:
            housekeeper.join(timeout_s)
        self.checkpoints.close()
        self.archiver.close()

    @property
    def in_flight(self) -> int:
        """Runs accepted and not yet done driving."""
        return self._in_flight

    # ------------------------------------------------------------------ driving

    @contextmanager
    def admit(self) -> Iterator[Admission]:
        """Hold a slot while a new Run is created and handed to `drive`; 503 when the worker is full."""
        if not self._slots.acquire(blocking=False):
            raise ApiError(
                503,
                "busy",
                f"the worker already has {self.queue_limit} Runs in flight; retry later",
                headers={"Retry-After": "1"},
            )
        admission = Admission()
        try:
            yield admission
        finally:
            if not admission.handed_over:
                self._slots.release()

    def drive(self, run_id: str, admission: Admission | None = None) -> Future[None]:
        """Drive the Run in the background until it is final or parks for a human.

        New Runs come with an admission (bounded); a Run resumed after a decision does not need one,
        since its decision is already durable and must not be turned away.
        """
        self.start()
        with self._lock:
            pool = self._pool
            self._in_flight += 1
            self._queued.add(run_id)
        holds_slot = admission is not None
        if admission is not None:
            admission.handed_over = True
        if pool is None:
            self._done(holds_slot, run_id)
            raise ApiError(503, "stopping", "the service is shutting down")
        return pool.submit(self._drive, run_id, holds_slot)

    def _done(self, holds_slot: bool, run_id: str | None = None) -> None:
        with self._lock:
            self._in_flight -= 1
            self._queued.discard(run_id or "")
        if holds_slot:
            self._slots.release()

    def _drive(self, run_id: str, holds_slot: bool) -> None:
        with run_context(run_id):
            try:
                # under a lease (K5b), so this service and any Celery workers on the same database never
                # drive one Run twice; None means another live worker has it
                result = RunWorker(self.runtime).execute(run_id, fresh=holds_slot)  # a new Run: still CREATED
                if result is not None:
                    log.info("run stopped", extra={"run_id": run_id, "state": result.state})
            except Exception:  # one Run's failure must not take the worker down
                log.exception("driving the run failed", extra={"run_id": run_id})
            finally:
                self._done(holds_slot, run_id)

    def redrive(self) -> list[str]:
        """Queue every Run that should be moving and that nobody drives (no live lease, unchanged for the
        re-drive grace): accepted before a restart, or left by a driver that died. Returns them."""
        if self._pool is None:
            return []
        settings = self.runtime.settings
        with self._lock:
            queued = set(self._queued)
        picked = [r for r in self.runtime.store.unowned_runs(settings.redrive_grace_s) if r not in queued]
        for run_id in picked:
            log.info("picking up a run nobody drives", extra={"run_id": run_id})
            try:
                self.drive(run_id)
            except ApiError:  # stopping
                break
        return picked

    def _resume(self, run_id: str) -> None:
        """The sweeper hands back a stuck Run that can still be resumed."""
        with self._lock:
            if run_id in self._queued:
                return
        self.drive(run_id)

    # ------------------------------------------------------------------ housekeeping

    def housekeep(self) -> None:
        """One pass: apply due approval timeouts (default-deny) and pick up Runs nobody drives; at every
        sweep interval sweep stuck Runs (the in-process sweeper of D1) and prune the working directories
        of Runs closed elsewhere; then chain the outbox."""
        for request_id in self.runtime.runs.expire_approvals():
            log.info("approval request timed out", extra={"request_id": request_id})
        self.redrive()
        settings = self.runtime.settings
        now = time.monotonic()
        if now - self._last_sweep >= settings.sweep_interval_s:
            self._last_sweep = now
            report = ZombieSweeper(self.runtime.store, self.runtime.machine, thresholds=settings.thresholds(),
                                   resume=self._resume, resume_decisions=self.runtime.runs.resume_decisions,
                                   max_stalls=settings.max_stalls).sweep_once()
            for run_id in report.recovered:
                log.warning("zombie run closed by the sweeper", extra={"run_id": run_id})
            for run_id in self.runtime.runs.prune_workdirs():
                log.info("working directory of a Run closed elsewhere removed", extra={"run_id": run_id})
        self.runtime.store.drain_all()
        self.publish_checkpoint()
        self.archiver.start_if_due()

    def publish_checkpoint(self) -> None:
        """Start publishing a signed checkpoint in the background when one is due (SPEC A3b: periodic,
        without a person; the interval is the setting checkpoint_interval_s)."""
        self.checkpoints.start_if_due()

    def _housekeeping(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.housekeep()
            except Exception:  # the loop must survive a database hiccup; the next pass retries
                log.exception("housekeeping pass failed")
