"""Child Runs (AgentInvoke, SPEC T4; seed 004 §3.5): a parent waits for its child like a slow tool call.

The parent's AgentInvoke step creates the child (tool_kinds.AgentCalls) and then waits here, in
EXECUTING, until the child is final: it drives the child under the child's lease until the child first
parks for a human (after that, the decision's process drives it on), and while the child waits it
sleeps on a poll, proving each time that it still holds its own
lease (its worker's, or one taken here for a drive that has none, heartbeated by the poll) so that no
second driver and no sweeper takes it for dead. The wait ends

- when the child is final: its result is the step's outcome;
- when the time given to the child passes: the child is cancelled (traced) and the step times out;
- when the parent leaves EXECUTING (cancelled, swept): the child is cancelled, nobody needs its result;
- when the parent's lease is taken over: the wait stops and writes nothing; the new driver re-attaches.

A child that ends while nobody drives its parent (the parent's process died) wakes it: the child's close
notes its parent (a closing hook), and once that close has committed the parent is resumed in this
process, on a thread of its own (the listeners of the child's close, such as live views, run first and
in order), under its lease — unless a live driver holds it, which then sees the end at its next poll.
A waiter in this process is woken at once. The process does not exit before such a resumption ends
(`harness approve` of a child finishes its parent's work). A parent nobody can resume here (its lease is
still held by a dead process) is resumed by whatever re-drives unowned Runs, or closed by the sweeper.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Protocol

from harness.domain.contracts import RunResult
from harness.domain.errors import UnknownRunError
from harness.domain.leases import Lease
from harness.domain.records import RunRecord, TraceRecordIn
from harness.drive.state_machine import StateMachine
from harness.kernel.states import FINAL, RunState
from harness.pipeline import waits
from harness.pipeline.tool_kinds import ChildWait
from harness.ports import Fence
from harness.ports.leases import RunLeases
from harness.ports.runs import RunReads

S = RunState
log = logging.getLogger(__name__)
ACTOR = "tool_controller"


class Runs(Protocol):
    """What the wait needs of the Run manager: its store's reads, its state machine, driving, results and
    cancelling (the Run manager is one)."""

    @property
    def store(self) -> RunReads: ...

    @property
    def machine(self) -> StateMachine: ...

    def drive(self, run_id: str, *, fence: Fence | None = None) -> RunResult: ...

    def result(self, run_id: str) -> RunResult: ...

    def cancel(self, run_id: str, *, by: str, reason: str = ...) -> RunResult: ...


class ChildRuns:
    """Waiting for child Runs, and waking parents whose child ended while nobody drove them."""

    def __init__(self, runs: Runs, leases: RunLeases, *, poll_s: float = 0.5) -> None:
        self.runs = runs
        self.store = runs.store
        #: the leases a wait takes for a parent whose drive holds none
        self.leases = leases
        self.poll_s = poll_s
        #: drives a Run under its lease, None when another live driver holds it (the worker's execute);
        #: set by the composition root. Without it children are driven unleased and parents never woken.
        self.leased_drive: Callable[[str], RunResult | None] | None = None
        self._ended = threading.Condition()
        self._lock = threading.Lock()
        self._driving: Counter[str] = Counter()
        self._closing: dict[str, str] = {}
        self._wakers: list[threading.Thread] = []
        runs.machine.on_close(self._note_close)
        runs.machine.subscribe(self._on_change)

    # ------------------------------------------------------------------ drives in this process

    @contextmanager
    def driving(self, run_id: str) -> Iterator[None]:
        """Mark a Run as driven in this process for the span of one drive."""
        with self._lock:
            self._driving[run_id] += 1
        try:
            yield
        finally:
            with self._lock:
                self._driving[run_id] -= 1
                if self._driving[run_id] <= 0:
                    del self._driving[run_id]

    def driven_here(self, run_id: str) -> bool:
        """Whether some thread of this process is driving the Run right now."""
        with self._lock:
            return run_id in self._driving

    # ------------------------------------------------------------------ the parent's wait

    def await_child(self, parent_id: str, child_id: str, until: float, fence: Fence | None) -> ChildWait:
        """Drive or wait for the child until it is final, time.monotonic() passes `until`, or the parent
        stops being this drive's (see the module docstring)."""
        hold: _ParentHold | None = None  # taken once there is something to wait for
        ours = self._parents_to_drive(child_id)
        try:
            while True:
                state = self.store.state_of(child_id)
                if state == S.AWAITING_HITL:
                    ours = False  # from now on whoever decides drives it
                elif ours and state not in FINAL and not self.driven_here(child_id):
                    self._drive(child_id)
                    # parked during that drive? then the decision's process drives it on, even when the
                    # decision came before the next read: driving it here too would race the decider
                    ours = self._parents_to_drive(child_id)
                    state = self.store.state_of(child_id)
                if state in FINAL:
                    return ChildWait(self.runs.result(child_id))
                hold = hold or _ParentHold(self, parent_id, fence)
                lost, left_executing = hold.lost()
                if lost is not None:
                    if left_executing:  # cancelled or swept: nobody will take the child's result
                        self._cancel(child_id, f"its parent Run {parent_id} stopped waiting: {lost}")
                    return ChildWait(None, "superseded", lost)
                left = until - time.monotonic()
                if left <= 0:
                    self._cancel(child_id, f"its parent Run {parent_id} stopped waiting: the time it gave "
                                           "the child passed")
                    return ChildWait(None, "deadline")
                hold.renew()
                if waits.suspendable():  # on a drive loop: switched out, the next look after a poll
                    waits.sleep(min(left, self.poll_s))
                else:
                    with self._ended:
                        self._ended.wait(min(left, self.poll_s))
        finally:
            if hold is not None:
                hold.release()

    def _parents_to_drive(self, child_id: str) -> bool:
        """Whether driving the child is this wait's job: until it first parks for a human it is its
        parent's (a re-attached parent picks up where its dead process stopped); once it has parked, the
        process that records the decision drives it on, and the parent only waits for its end. (Past a
        decision a second driver could repeat the child's side effects: the lease keeps out only
        drivers that hold one.)"""
        return all(x.to_state != S.AWAITING_HITL for x in self.store.transitions_of(child_id))

    def _drive(self, child_id: str) -> None:
        if self.leased_drive is not None:
            self.leased_drive(child_id)  # None: another live driver has it; we wait for its end
        else:
            self.runs.drive(child_id)

    def _cancel(self, run_id: str, reason: str) -> None:
        if self.store.state_of(run_id) not in FINAL:
            self.runs.cancel(run_id, by=ACTOR, reason=reason)

    # ------------------------------------------------------------------ a child's end wakes its parent

    def _note_close(self, run: RunRecord, _final: RunState) -> Sequence[TraceRecordIn]:
        """Closing hook: remember whose child is closing, for the listener once the close committed."""
        if run.parent_run_id is not None:
            with self._lock:
                if len(self._closing) > 10_000:  # closes that lost their race leave entries behind
                    self._closing.clear()
                self._closing[run.run_id] = run.parent_run_id
        return ()

    def _on_change(self, run_id: str, _source: RunState, target: RunState) -> None:
        if target not in FINAL:
            return
        with self._lock:
            parent_id = self._closing.pop(run_id, None)
        if parent_id is None:
            return
        with self._ended:
            self._ended.notify_all()
        self.wake(parent_id)

    def wake(self, parent_id: str) -> None:
        """Resume a parent whose child ended, on a thread of its own, unless it is driven in this process
        (its waiter was just woken) or not waiting; a live driver elsewhere keeps it (lease)."""
        drive = self.leased_drive
        if drive is None or self.driven_here(parent_id):
            return
        try:
            if self.store.state_of(parent_id) != S.EXECUTING:
                return
        except UnknownRunError:
            return

        def resume() -> None:
            try:
                drive(parent_id)
            except Exception:  # the child's close stands whatever happens to its parent's resumption
                log.exception("resuming parent run %s after its child ended failed", parent_id)

        thread = threading.Thread(target=resume, name=f"harness-wake-{parent_id}")  # not a daemon: see above
        with self._lock:
            self._wakers = [w for w in self._wakers if w.is_alive()] + [thread]
        thread.start()

    def close(self, timeout_s: float = 30.0) -> None:
        """Let resumptions of parents in flight finish (before the runtime's connections close)."""
        with self._lock:
            wakers, self._wakers = self._wakers, []
        for thread in wakers:
            thread.join(timeout_s)


class _ParentHold:
    """The parent's proof, while it waits, that it is still this drive's: the drive's own fence, or a
    lease taken here for a drive that has none (heartbeated by the wait's polls)."""

    def __init__(self, children: ChildRuns, parent_id: str, fence: Fence | None) -> None:
        self.children = children
        self.parent_id = parent_id
        self.fence = fence
        self.leases: RunLeases | None = None
        self.lease: Lease | None = None
        self.taken = False
        self.beat_at = time.monotonic()
        if fence is None:
            self.leases = children.leases
            owner = f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}{waits.strand_tag()}:waiting"
            self.lease = self.leases.acquire(parent_id, owner)
            self.taken = self.lease is None

    def lost(self) -> tuple[str | None, bool]:
        """Why the parent is no longer this drive's to continue (None: it still is), and whether that is
        because it left EXECUTING (rather than because another driver took it over)."""
        if self.taken or (self.fence is not None and not self.fence.holds()):
            return "another driver holds the parent Run's lease; it re-attaches to the same child", False
        state = self.children.store.state_of(self.parent_id)
        if state != S.EXECUTING:
            return f"the parent Run is {state.value}", True
        return None, False

    def renew(self) -> None:
        """Heartbeat a lease taken here, a third of its time-to-live at a time."""
        if self.leases is None or self.lease is None:
            return
        if time.monotonic() - self.beat_at >= self.leases.ttl_s / 3:
            self.beat_at = time.monotonic()
            self.lease = self.leases.heartbeat(self.lease)
            self.taken = self.lease is None

    def release(self) -> None:
        """Give back a lease taken here."""
        if self.leases is not None and self.lease is not None:
            self.leases.release(self.lease)
