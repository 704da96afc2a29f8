"""A Run driven under its lease (SPEC K5b, S1, T6): the loop every worker (in-process, Celery) runs.

The worker takes the Run's lease (or leaves the Run to whoever holds it), heartbeats it while the Run is
driven (`Heartbeats`: one scheduling thread per process, a renewal on a thread of its own when one falls
due), and releases it when the Run is final or parked. If a
heartbeat finds the lease gone (the worker was paused past its lease and the Run was taken over or
swept), the drive is fenced: every later transition carries the stale epoch and is refused, and no
further tool call is made. A Run whose workers keep dying is failed after `max_stalls` takeovers; a death
while the drive waited on a call outside the process (a model's answer, a sandboxed skill, a child Run)
counts none, so restarts of a busy service never fail the Runs that were waiting.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import heapq
import itertools
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field

from harness.domain.contracts import RunResult
from harness.domain.leases import Lease, Standing
from harness.drive.state_machine import StateMachine
from harness.kernel.states import FINAL, NOTHING_TO_DRIVE, RunState
from harness.pipeline import waits
from harness.pipeline.run_manager import RunManager
from harness.ports.leases import RunLeases, RunLookup

log = logging.getLogger("harness.drive.worker")
S = RunState


#: states with a legal move to FAILED (seed table + the sweeper extensions of SPEC K2)
_CAN_FAIL = frozenset({S.CREATED, S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TRACING})


def default_owner() -> str:
    """host:pid:thread — unique per worker thread."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


@dataclass
class Fence:
    """The lease a drive runs under; `lost` flips when a heartbeat finds it taken over."""

    lease: Lease
    leases: RunLeases
    lost: bool = False

    @property
    def epoch(self) -> int:
        """The epoch every transition of this drive carries."""
        return self.lease.epoch

    def holds(self) -> bool:
        """Checked before every side effect: still ours and unexpired."""
        if self.lost:
            return False
        if not self.leases.holds(self.lease):
            self.lost = True
        return not self.lost

    def standing(self) -> Standing:
        """The Run's state and whether the lease is still ours, in one read (the check between steps)."""
        now = self.leases.standing(self.lease)
        if not now.held:
            self.lost = True
        return Standing(now.state, not self.lost)

    def lose(self) -> None:
        """A write fenced by this lease's epoch found it taken over."""
        self.lost = True


@dataclass(eq=False)
class _Beat:
    """One drive's heartbeat: its fence, how often it is renewed, the renewal under way, if any, and
    whether the drive waits outside the process now (`out`) and the Run's row says so (`marked`)."""

    fence: Fence
    interval: float
    stopped: bool = False
    renewal: concurrent.futures.Future[None] | None = field(default=None, repr=False)
    out: bool = False
    marked: bool = False
    #: held while a renewal writes the lease, so the drive switched back in sees whether the row says
    #: it waits, and clears that before it runs on
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)


class Heartbeats:
    """Renews the leases of the Runs a process drives, from one scheduling thread.

    A drive used to start a heartbeat thread of its own and join it at the end. Most drives end long
    before their first beat is due (a third of the lease), and on a loaded machine starting and joining
    that thread cost a short Run more than a quarter of its time. Here one daemon thread keeps the due
    times; a beat that falls due is made on a small pool of renewal threads (`RENEWERS`; a thousand Runs
    on a drive loop would otherwise start a thread per beat), so a renewal that waits (for the Run's row,
    which the drive's own open transaction may hold, or for a database that is away) holds up no other
    Run's renewal while a thread is free, and the next beat of that Run waits until it is done.
    """

    #: threads that make the renewals that fall due (each holds a pooled connection while it renews)
    RENEWERS = 8
    #: how long a drive waits outside the process before a renewal says so in the Run's row (a shorter
    #: wait, such as most skill calls, costs no write; a death in its first moments counts a stall)
    MARK_AFTER_S = 0.1

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)  # a forked worker starts with its own thread

    def _reset(self) -> None:
        self._cond = threading.Condition()
        #: (due, order, beat, mark): a beat's regular renewal, or (mark) the one that says it waits
        self._due: list[tuple[float, int, _Beat, bool]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._renewers = concurrent.futures.ThreadPoolExecutor(self.RENEWERS, thread_name_prefix="lease-renewal")

    def hold(self, fence: Fence) -> _Beat:
        """Start renewing the fence's lease every third of its time to live."""
        beat = _Beat(fence, fence.leases.ttl_s / 3)
        with self._cond:
            heapq.heappush(self._due, (time.monotonic() + beat.interval, next(self._order), beat, False))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._schedule, daemon=True, name="lease-heartbeats")
                self._thread.start()
            self._cond.notify()
        return beat

    def stop(self, beat: _Beat) -> None:
        """Make no further renewal of this beat (one under way finishes; `wait` waits for it)."""
        with self._cond:
            beat.stopped = True

    def switched(self, beat: _Beat, out: bool) -> None:
        """The beat's drive switched out on a wait outside the process (`out`) or back in. A wait that
        lasts gets a renewal that marks the Run's row, so that a takeover after this process dies counts
        no stall against the Run (the Run did not kill it); switched back in, the drive clears the mark
        before it runs on, so a death while it works still counts."""
        if beat.stopped:
            return
        if out:
            beat.out = True
            with self._cond:
                heapq.heappush(self._due, (time.monotonic() + self.MARK_AFTER_S, next(self._order), beat, True))
                self._cond.notify()
            return
        beat.out = False
        with beat.lock:  # a renewal writing now finishes first
            if not beat.marked:
                return
            beat.marked = False
            try:
                renewed = beat.fence.leases.heartbeat(beat.fence.lease, waiting=False)
            except Exception as exc:  # the drive runs on; a death now would not count a stall
                log.warning("lease on run %s still says its drive waits (%s)", beat.fence.lease.run_id,
                            exc.__class__.__name__)
                return
            if renewed is None:
                beat.fence.lost = True
            else:
                beat.fence.lease = renewed

    def wait(self, beat: _Beat) -> None:
        """Wait for the beat's renewal under way, if any: called once the drive's last transaction has
        committed (a renewal waiting for the Run's row that transaction holds would otherwise never end)."""
        with self._cond:
            renewal = beat.renewal
        if renewal is not None:
            waits.result(renewal)  # a drive on a drive loop switches out meanwhile

    def _schedule(self) -> None:
        with self._cond:
            while True:
                if not self._due:
                    self._cond.wait()
                    continue
                due, _, beat, mark = self._due[0]
                if beat.stopped or (mark and (not beat.out or beat.marked)):
                    heapq.heappop(self._due)
                    continue
                delay = due - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                heapq.heappop(self._due)
                if beat.renewal is None or beat.renewal.done():  # else the last one still waits
                    try:
                        beat.renewal = self._renewers.submit(self._renew, beat)
                    except RuntimeError as exc:  # no thread to be had now: the next beat tries again
                        log.warning("heartbeat for run %s not started (%s)", beat.fence.lease.run_id, exc)
                if not mark:  # a mark is one renewal more; the beat keeps its own cadence
                    heapq.heappush(self._due, (time.monotonic() + beat.interval, next(self._order), beat, False))

    def _renew(self, beat: _Beat) -> None:
        fence = beat.fence
        try:
            with beat.lock:
                waiting = beat.out
                beat.marked = beat.marked or waiting  # set first: a failed write is cleared all the same
                renewed = fence.leases.heartbeat(fence.lease, waiting=waiting)
                beat.marked = waiting if renewed is not None else beat.marked
        except Exception as exc:  # a database outage must not end the heartbeat
            # the next beat tries again; if none succeeds in time the lease expires, another worker
            # takes the Run over and this drive's writes are fenced by the epoch they carry
            log.warning("heartbeat for run %s failed (%s); trying again in %.3gs", fence.lease.run_id,
                        exc.__class__.__name__, beat.interval)
            return
        if renewed is None:
            with self._cond:
                stopped, beat.stopped = beat.stopped, True
            if not stopped:  # else the drive has just released the lease itself
                log.warning("lease on run %s lost; this worker stops driving it", fence.lease.run_id)
            fence.lost = True
            return
        fence.lease = renewed


#: the heartbeats of every drive in this process
HEARTBEATS = Heartbeats()


class LeasedDrive:
    """Drives Runs for one process or thread, each under its lease."""

    def __init__(self, store: RunLookup, runs: RunManager, machine: StateMachine, leases: RunLeases, *,
                 owner: str, max_stalls: int, heartbeats: Heartbeats = HEARTBEATS) -> None:
        self.store = store
        self.runs = runs
        self.machine = machine
        self.owner = owner
        self.leases = leases
        self.max_stalls = max_stalls
        self.heartbeats = heartbeats

    def execute(self, run_id: str, *, fresh: bool = False) -> RunResult | None:
        """Drive the Run if this worker can take its lease; the Run's result when it is final or waits for
        a human; None when another live worker holds it. `fresh`: the Run was just accepted (a queue hands
        it over), so it is most likely still in CREATED: one read first tells, and its context is then
        assembled before the lease is taken (RunManager.prepared_ahead): one commit fewer."""
        # the lease is taken in the transaction of the drive's first transitions and given back in that
        # of its park or close (the unit of work's first and last commits), not in commits of its own;
        # it is taken only while the Run has something to drive, so no read of the Run comes first
        beat: _Beat | None = None
        try:
            with self.runs.prepared_ahead(run_id) if fresh else contextlib.nullcontext(), \
                    self.runs.units.unit(run_id):
                # one owner per drive: drives sharing a drive loop's thread must not take each other's lease
                lease = self.leases.acquire(run_id, self.owner + waits.strand_tag(), to_drive=True)
                if lease is not None:
                    fence = Fence(lease, self.leases)
                    if lease.stalls >= self.max_stalls:
                        return self._poisoned(run_id, fence)
                    beat = self.heartbeats.hold(fence)
                    held = beat
                    try:
                        with waits.watched(lambda out: self.heartbeats.switched(held, out)):
                            return self.runs.drive(run_id, fence=fence)
                    finally:
                        self.heartbeats.stop(beat)
                        if not fence.lost:
                            self.leases.release(fence.lease)
        finally:
            # waited for once the unit's last transaction has committed: a heartbeat that fired during it
            # waits for the Run's row that transaction holds, so waiting for it before the commit would
            # wait forever on PostgreSQL (and for the lock timeout on SQLite and MariaDB). A unit opened
            # around this one (the Run's acceptance, `RunManager.create_run`) is committed here too.
            if beat is not None:
                self.runs.units.boundary()
                self.heartbeats.wait(beat)
        return self._not_driven(run_id)

    def _not_driven(self, run_id: str) -> RunResult | None:
        """No lease to be had: the Run's result when it is final or waits for a human (UnknownRunError
        when there is no such Run), None when another live worker holds it."""
        if self.store.get_run(run_id).state in NOTHING_TO_DRIVE:
            return self.runs.result(run_id)
        return None

    def _poisoned(self, run_id: str, fence: Fence) -> RunResult:
        run = self.store.get_run(run_id)
        if run.state in _CAN_FAIL:
            message = f"worker_stalled: the Run's workers died {fence.lease.stalls} times (poison input?)"
            self.machine.transition(run_id, run.state, S.FAILED, actor=self.owner, reason=message,
                                            lease_epoch=fence.epoch, result={"error": message})
        elif run.state not in FINAL:
            self.machine.advance(run_id, run.state, lease_epoch=fence.epoch)
        self.leases.release(fence.lease)
        return self.runs.result(run_id)
