"""The service's embedded worker (SPEC D1, U2): drives accepted Runs on a drive loop, and a
housekeeping loop applies approval timeouts, sweeps and drains the trace outbox.

Runs are driven as greenlets on asyncio loops (harness.pipeline.drive_loop): a Run waiting for a model,
a skill, a sandbox or a child Run holds no thread, so one process drives `concurrency` Runs at once (1,000
by default). Accepted Runs beyond that wait in the loop, in order; beyond `queue_limit` waiting in memory
an accepted Run is left to the re-drive, which takes it from the database, oldest first, as room frees up.
Nothing accepted is lost or refused here (the backlog's bound is the library's admission control): on
start, and at every housekeeping pass, the worker picks up every Run that should be moving and that
nobody drives (no live lease) — Runs accepted or resumed before this process (or another replica) died,
and Runs it had no room to queue. Each drive holds the Run's lease, so several
replicas on one database never drive one Run twice. A Run that raises while being driven stays in its
state and is logged with its run_id; it is picked up again, and the zombie sweeper is the backstop.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager

from harness.audit.publisher import CheckpointPublisher
from harness.config import Runtime
from harness.domain.errors import SkillsElsewhereError
from harness.drive.sweeper import ZombieSweeper
from harness.drive.worker import RunWorker
from harness.pipeline.drive_loop import DriveLoop
from harness.retention.scheduled import ScheduledArchiver
from harness.service.logs import run_context
from harness.stores import audit_reads
from harness.wiring.retention import archiver_factory
from harness.wiring.signer import checkpoint_signer

log = logging.getLogger("harness.drive.worker")
#: how long a Run left for a process with its agent is not picked up again here
ELSEWHERE_S = 60.0


def _checkpoint_publisher(runtime: Runtime) -> CheckpointPublisher:
    """The service's checkpoint publisher: its first checkpoint one interval after it starts."""
    s = runtime.settings
    return CheckpointPublisher.from_settings(audit_reads(runtime.store), s.checkpoint_interval_s, s.checkpoint_dir,
                                             s.checkpoint_witnesses, wait_first=True, signer=checkpoint_signer(s),
                                             rule=s.witness_rule())


class Admission:
    """A new Run handed to the worker: its drive knows the Run is most likely still in CREATED."""


class EmbeddedWorker:
    """Drives Runs in-process."""

    def __init__(
        self,
        runtime: Runtime,
        *,
        concurrency: int = 1000,
        queue_limit: int = 10_000,
        housekeeping_interval_s: float = 1.0,
    ) -> None:
        self.runtime = runtime
        #: Runs driven at once (each waits without a thread)
        self.concurrency = concurrency
        #: Runs queued in memory at most (driven or waiting for a place); more are left to the re-drive
        self.queue_limit = queue_limit
        self.interval = housekeeping_interval_s
        self._lock = threading.Lock()
        self._pool: DriveLoop | None = None
        self._stop = threading.Event()
        #: stop() was called: drive() no longer starts the loop again (start() does, explicitly)
        self._stopped = False
        self._housekeeper: threading.Thread | None = None
        self._in_flight = 0
        self._last_sweep = time.monotonic()
        #: Runs this worker has queued or is driving, so the re-drive does not queue them twice
        self._queued: set[str] = set()
        #: Runs whose plan calls skills this process lacks (another agent's), not re-driven here until then
        self._elsewhere: dict[str, float] = {}
        self.checkpoints = _checkpoint_publisher(runtime)
        #: archives final Runs past the retention period (HARNESS_RETENTION_DAYS) every archive interval
        self.archiver = ScheduledArchiver(archiver_factory(runtime.store, runtime.settings.checkpoint_dir,
                                                           runtime.settings.checkpoint_witnesses,
                                                           checkpoint_signer(runtime.settings),
                                                           runtime.settings.witness_rule()))

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start the pool and the housekeeping loop (idempotent)."""
        with self._lock:
            if self._pool is not None:
                return
            self._stopped = False
            self._stop.clear()
            settings = self.runtime.settings
            self._pool = DriveLoop(concurrency=self.concurrency, threads=settings.drive_loop_threads(),
                                   max_lag_s=settings.drive_max_lag_s, name="harness-drives")
            self._housekeeper = threading.Thread(
                target=self._housekeeping, name="harness-housekeeping", daemon=True
            )
            self._housekeeper.start()
            # the housekeeping drains the outbox every pass: a closing Run need not queue on the chain head
            self.runtime.machine.close_waits_for_chain = False
        self.redrive()  # Runs accepted before a restart are driven, not left to the sweeper

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stop taking work, let Runs in flight reach their next stop, and end the loop. Runs queued here
        and not started stay queued in the database: the next process (or another replica) drives them."""
        with self._lock:
            pool, self._pool = self._pool, None
            housekeeper, self._housekeeper = self._housekeeper, None
            self._stopped = True
        self._stop.set()
        if pool is not None:
            pool.stop(timeout_s)
        if housekeeper is not None:
            housekeeper.join(timeout_s)
            self.runtime.machine.close_waits_for_chain = True
            try:  # what closes left to the housekeeping is chained before the process goes
                self.runtime.store.drain_all()
            except Exception:  # the database is gone: the records wait in the outbox for the next process
                log.exception("chaining the outbox on the way out failed")
        self.checkpoints.close()
        self.archiver.close()

    @property
    def threads(self) -> int:
        """What the health document reports as the worker's threads: the Runs it drives at once."""
        return self.concurrency

    @property
    def in_flight(self) -> int:
        """Runs queued here and not yet done driving."""
        return self._in_flight

    @property
    def driving(self) -> int:
        """Runs being driven now (between their first step and their end; waiting ones included)."""
        pool = self._pool
        return pool.driving if pool is not None else 0

    # ------------------------------------------------------------------ driving

    @contextmanager
    def admit(self) -> Iterator[Admission]:
        """A place for a new Run while it is created and handed to `drive`. It is never refused here: an
        accepted Run is a row, and one this worker has no room to queue is taken up by the re-drive."""
        yield Admission()

    def drive(self, run_id: str, admission: Admission | None = None) -> Future[None]:
        """Drive the Run in the background until it is final or parks for a human.

        A new Run comes with its admission (the drive then knows it is still in CREATED). When the memory
        queue is full the Run is not queued: its future is done at once and the re-drive takes the Run
        from the database, in order, when there is room. Once the worker is stopping it is not queued
        either: the Run is a row, accepted, and the next process (or another replica) drives it.
        """
        if not self._stopped:
            self.start()  # the first drive of a worker nobody started starts it
        fresh = admission is not None
        with self._lock:  # held through the submit: a stop then finds the drive queued (and never starts it)
            pool = self._pool
            if pool is None:
                log.info("the service is stopping: the run stays queued for the next process",
                         extra={"run_id": run_id})
                return _done_future()
            if self._in_flight >= self.queue_limit:
                log.info("memory queue full: the run waits for the re-drive", extra={"run_id": run_id})
                return _done_future()
            self._in_flight += 1
            self._queued.add(run_id)
            # a drive the stopping loop never starts leaves its Run queued (a row) for the next process
            return pool.submit(lambda: self._drive(run_id, fresh), not_started=lambda: self._done(run_id))

    def _done(self, run_id: str) -> None:
        with self._lock:
            self._in_flight -= 1
            self._queued.discard(run_id)

    def _drive(self, run_id: str, fresh: bool) -> None:
        with run_context(run_id):
            try:
                # under a lease (K5b), so this service and any Celery workers on the same database never
                # drive one Run twice; None means another live worker has it
                result = RunWorker(self.runtime).execute(run_id, fresh=fresh)  # a new Run: still CREATED
                if result is not None:
                    log.info("run stopped", extra={"run_id": run_id, "state": result.state})
            except SkillsElsewhereError as exc:  # another agent's Run: left for a process that runs it
                with self._lock:
                    self._elsewhere[run_id] = time.monotonic() + ELSEWHERE_S
                log.warning(str(exc), extra={"run_id": run_id})
            except Exception:  # one Run's failure must not take the worker down
                log.exception("driving the run failed", extra={"run_id": run_id})
            finally:
                self._done(run_id)

    def redrive(self) -> list[str]:
        """Queue every Run that should be moving and that nobody drives (no live lease, unchanged for the
        re-drive grace): accepted before a restart, or left by a driver that died. Returns them."""
        if self._pool is None:
            return []
        settings = self.runtime.settings
        now = time.monotonic()
        with self._lock:
            self._elsewhere = {r: until for r, until in self._elsewhere.items() if until > now}
            queued = set(self._queued) | set(self._elsewhere)
            room = self.queue_limit - self._in_flight
        if room <= 0:
            return []
        picked = [r for r in self.runtime.store.unowned_runs(settings.redrive_grace_s) if r not in queued][:room]
        for run_id in picked:
            if self._pool is None:  # stopping: what is left stays queued for the next process
                break
            log.info("picking up a run nobody drives", extra={"run_id": run_id})
            self.drive(run_id)
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


def _done_future() -> Future[None]:
    future: Future[None] = concurrent.futures.Future()
    future.set_result(None)
    return future
