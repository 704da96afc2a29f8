"""A Run driven under its lease (SPEC K5b, S1, T6): the loop every worker (in-process, Celery) runs.

The worker takes the Run's lease (or leaves the Run to whoever holds it), heartbeats it from a
background thread while the Run is driven, and releases it when the Run is final or parked. If a
heartbeat finds the lease gone (the worker was paused past its lease and the Run was taken over or
swept), the drive is fenced: every later transition carries the stale epoch and is refused, and no
further tool call is made. A Run whose workers keep dying is failed after `max_stalls` takeovers.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass

from harness.domain.contracts import RunResult
from harness.domain.leases import Lease, Standing
from harness.kernel import FINAL, RunState
from harness.pipeline.run_manager import RunManager
from harness.ports.leases import RunLeases, RunLookup
from harness.state_machine import StateMachine

log = logging.getLogger("harness.worker")
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


class LeasedDrive:
    """Drives Runs for one process or thread, each under its lease."""

    def __init__(self, store: RunLookup, runs: RunManager, machine: StateMachine, leases: RunLeases, *,
                 owner: str, max_stalls: int) -> None:
        self.store = store
        self.runs = runs
        self.machine = machine
        self.owner = owner
        self.leases = leases
        self.max_stalls = max_stalls

    def execute(self, run_id: str) -> RunResult | None:
        """Drive the Run if this worker can take its lease; None when another live worker holds it."""
        run = self.store.get_run(run_id)
        if run.state in FINAL or run.state == S.AWAITING_HITL:
            return self.runs.result(run_id)
        # the lease is taken in the transaction of the drive's first transitions and given back in that
        # of its park or close (the unit of work's first and last commits), not in commits of its own
        stop = threading.Event()
        beat: threading.Thread | None = None
        try:
            with self.runs.units.unit(run_id):
                lease = self.leases.acquire(run_id, self.owner)
                if lease is None:
                    return None
                fence = Fence(lease, self.leases)
                if lease.stalls >= self.max_stalls:
                    return self._poisoned(run_id, fence)
                beat = threading.Thread(target=self._heartbeat, args=(fence, stop), daemon=True,
                                        name=f"heartbeat-{run_id}")
                beat.start()
                try:
                    return self.runs.drive(run_id, fence=fence)
                finally:
                    stop.set()
                    if not fence.lost:
                        self.leases.release(fence.lease)
        finally:
            # joined once the unit's last transaction has committed: a heartbeat that fired during it
            # waits for the Run's row that transaction holds, so joining it before the commit would wait
            # forever on PostgreSQL (and for the lock timeout on SQLite and MariaDB)
            if beat is not None:
                beat.join()

    def _heartbeat(self, fence: Fence, stop: threading.Event) -> None:
        interval = self.leases.ttl_s / 3
        while not stop.wait(interval):
            try:
                renewed = self.leases.heartbeat(fence.lease)
            except Exception as exc:  # a database outage must not end the heartbeat
                # the next beat tries again; if none succeeds in time the lease expires, another worker
                # takes the Run over and this drive's writes are fenced by the epoch they carry
                log.warning("heartbeat for run %s failed (%s); trying again in %.3gs", fence.lease.run_id,
                            exc.__class__.__name__, interval)
                continue
            if renewed is None:
                if not stop.is_set():  # else the drive has just released the lease itself
                    log.warning("lease on run %s lost; this worker stops driving it", fence.lease.run_id)
                fence.lost = True
                return
            fence.lease = renewed

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
