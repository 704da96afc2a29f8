"""Random legal and illegal transitions on several Runs, over a real SQLite store (SPEC K2-K6, A1, A3).

A hypothesis rule-based machine drives Runs through StateMachine, and sometimes straight through the
store (a worker dying between its compare-and-set and the funnel) to be recovered later, and checks
after every step that the store agrees with an independent model of the SPEC.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    MultipleResults,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from harness.adapters.sql import schema as t
from harness.adapters.sql.store import NewRun, SqlStore
from harness.audit.chain import GENESIS_HASH, record_hash
from harness.clock import FakeClock
from harness.errors import InvalidTransitionError
from harness.kernel import FINAL, FINAL_EVENT, LEGAL, TRANSIENT, RunState, job_status, targets_from
from harness.state_machine import StateMachine

S = RunState
SETTINGS = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
FORWARD: dict[RunState, list[RunState]] = {
    S.CREATED: [S.PREPARING],
    S.PREPARING: [S.PLANNING],
    S.PLANNING: [S.POLICY_CHECK],
    S.POLICY_CHECK: [S.EXECUTING, S.AWAITING_HITL],
    S.AWAITING_HITL: [S.EXECUTING],
    S.EXECUTING: [S.TRACING],
}
ILLEGAL_PAIRS = sorted((s, t) for s in RunState for t in RunState if (s, t) not in LEGAL)


def expected_final(path: list[RunState]) -> RunState:
    """SPEC K3, independent of the kernel: TRACING's exit from how TRACING was last entered."""
    entry = max(i for i, s in enumerate(path) if s == S.TRACING)
    before = path[entry - 1]
    if before == S.EXECUTING:
        return S.SUCCEEDED
    if before == S.TIMEOUT:
        return S.CLOSED_REJECTED if path[entry - 2] == S.AWAITING_HITL else S.CLOSED_FAILED
    return {S.REJECTED: S.CLOSED_REJECTED, S.FAILED: S.CLOSED_FAILED, S.CANCELLED: S.CLOSED_CANCELLED}[before]


def funnel(path: list[RunState]) -> None:
    """Extend `path` the way the kernel moves a Run on by itself: transient → TRACING → final."""
    if path[-1] in TRANSIENT:
        path.append(S.TRACING)
    if path[-1] == S.TRACING:
        path.append(expected_final(path))


class RunLifecycle(RuleBasedStateMachine):
    """The store, driven at random, against a model of what the SPEC says each call does."""

    runs = Bundle("runs")

    def __init__(self, template: Path) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="harness-stateful-"))
        shutil.copy(template, self.dir / "harness.db")
        self.clock = FakeClock()
        self.store = SqlStore.open(str(self.dir / "harness.db"), self.clock, migrate_schema=False)
        self.machine = StateMachine(self.store, drain_on_close=False)
        self.paths: dict[str, list[RunState]] = {}
        self.illegal = 0
        self.lost = 0
        self.fenced = 0

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def state(self, run_id: str) -> RunState:
        return self.paths[run_id][-1]

    # ------------------------------------------------------------------ rules

    def _create(self) -> str:
        run, created = self.store.create_run(NewRun("tenant", "user", "session", {"task": len(self.paths)}))
        assert created
        self.paths[run.run_id] = [S.CREATED]
        return run.run_id

    @initialize(target=runs)
    def first_runs(self) -> MultipleResults[str]:
        return multiple(self._create(), self._create())

    @precondition(lambda self: len(self.paths) < 5)
    @rule(target=runs)
    def create(self) -> str:
        return self._create()

    def _move(self, run_id: str, target: RunState) -> None:
        outcome = self.machine.transition(run_id, self.state(run_id), target, actor="test", reason="legal move")
        assert outcome.applied and not outcome.fenced
        self.paths[run_id].append(target)
        funnel(self.paths[run_id])

    @rule(run_id=runs, data=st.data(), moves=st.integers(min_value=1, max_value=6))
    def progress(self, run_id: str, data: st.DataObject, moves: int) -> None:
        """Along the main path, so that deep states (AWAITING_HITL, EXECUTING) are reached often."""
        for _ in range(moves):
            if self.state(run_id) not in FORWARD:
                return
            self._move(run_id, data.draw(st.sampled_from(FORWARD[self.state(run_id)]), label="forward"))

    @rule(run_id=runs, data=st.data(), moves=st.integers(min_value=1, max_value=3))
    def legal_moves(self, run_id: str, data: st.DataObject, moves: int) -> None:
        for _ in range(moves):
            cur = self.state(run_id)
            targets = sorted(targets_from(cur) - FINAL)  # TRACING's exit is the kernel's, never a caller's
            if not targets:
                return
            self._move(run_id, data.draw(st.sampled_from(targets), label="target"))

    @rule(run_id=runs, data=st.data())
    def die_after_compare_and_set(self, run_id: str, data: st.DataObject) -> None:
        """A worker commits a move and dies before the funnel: the Run may sit in a transient state."""
        cur = self.state(run_id)
        targets = sorted(targets_from(cur) - FINAL)
        if not targets:
            return
        target = data.draw(st.sampled_from(targets), label="target")
        outcome = self.store.transition(run_id, cur, target, actor="dying-worker", reason="then crashed")
        assert outcome.applied
        self.paths[run_id].append(target)

    @rule(run_id=runs)
    def recover(self, run_id: str) -> None:
        cur = self.state(run_id)
        if cur not in TRANSIENT and cur != S.TRACING:
            return
        assert self.machine.advance(run_id, cur, forced_by="zombie_sweeper") in FINAL
        funnel(self.paths[run_id])

    @rule(run_id=runs, pair=st.sampled_from(ILLEGAL_PAIRS))
    def illegal_move(self, run_id: str, pair: tuple[RunState, RunState]) -> None:
        source, target = pair
        with pytest.raises(InvalidTransitionError):
            self.machine.transition(run_id, source, target, actor="test", reason="illegal move")
        self.illegal += 1

    @rule(run_id=runs, data=st.data())
    def illegal_from_current_state(self, run_id: str, data: st.DataObject) -> None:
        cur = self.state(run_id)
        target = data.draw(st.sampled_from(sorted(set(RunState) - targets_from(cur))), label="target")
        with pytest.raises(InvalidTransitionError):
            self.machine.transition(run_id, cur, target, actor="test", reason="illegal move")
        self.illegal += 1

    @rule(run_id=runs, data=st.data())
    def stale_move(self, run_id: str, data: st.DataObject) -> None:
        cur = self.state(run_id)
        stale = sorted((s, t) for s, t in LEGAL if s != cur)
        source, target = data.draw(st.sampled_from(stale), label="stale pair")
        outcome = self.machine.transition(run_id, source, target, actor="slow-worker", reason="stale source")
        assert not outcome.applied
        assert outcome.actual == cur
        self.lost += 1

    @rule(run_id=runs, data=st.data(), epoch=st.integers(min_value=1, max_value=5))
    def fenced_move(self, run_id: str, data: st.DataObject, epoch: int) -> None:
        cur = self.state(run_id)
        targets = sorted(targets_from(cur) - FINAL)
        if not targets:
            return
        target = data.draw(st.sampled_from(targets), label="target")
        outcome = self.machine.transition(
            run_id, cur, target, actor="paused-worker", reason="old lease", lease_epoch=epoch
        )
        assert not outcome.applied and outcome.fenced
        self.lost += 1
        self.fenced += 1

    @rule(seconds=st.floats(min_value=0.001, max_value=3600))
    def time_passes(self, seconds: float) -> None:
        self.clock.advance(seconds)

    @rule()
    def drain(self) -> None:
        self.store.drain_all()
        assert self.store.outbox_backlog() == 0
        prev, seq = GENESIS_HASH, 0
        for rec in self.store.iter_trace():
            seq += 1
            assert (rec.seq, rec.prev_hash) == (seq, prev)
            assert rec.hash == record_hash(
                rec.seq, rec.record_id, rec.run_id, rec.kind, rec.prev_hash, rec.payload
            )
            prev = rec.hash
        assert self.store.chain_head() == (seq, prev)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def store_agrees_with_the_model(self) -> None:
        for run_id, path in self.paths.items():
            run = self.store.get_run(run_id)
            assert run.state == path[-1]
            assert self.store.legacy_job(run_id) == (job_status(run.state).value, run.state.value)
            rows = self.store.transitions_of(run_id)
            assert [r.seq for r in rows] == list(range(run.version + 1))
            assert [r.to_state for r in rows] == path
            assert rows[0].from_state is None
            for before, after in pairwise(rows):
                assert after.from_state == before.to_state
                assert (after.from_state, after.to_state) in LEGAL

    @invariant()
    def final_states_are_entered_once_and_only_from_tracing(self) -> None:
        for path in self.paths.values():
            finals = [i for i, s in enumerate(path) if s in FINAL]
            assert finals in ([], [len(path) - 1])
            assert all(path[i - 1] == S.TRACING for i in finals)

    @invariant()
    def every_attempt_is_audited(self) -> None:
        assert len(self.store.audit_events(event="illegal_transition")) == self.illegal
        lost = self.store.audit_events(event="transition_lost_race")
        assert len(lost) == self.lost
        assert sum(1 for e in lost if e.detail["fenced"]) == self.fenced

    @invariant()
    def closed_runs_reconcile_and_carry_one_run_trace(self) -> None:
        finals = Counter(path[-1] for path in self.paths.values() if path[-1] in FINAL)
        for final, event in FINAL_EVENT.items():
            assert len(self.store.audit_events(event=event)) == finals[final]
        kind = t.trace_records.c.kind
        with self.store.engine.connect() as conn:
            traced = conn.execute(sa.select(sa.func.count()).where(kind == "run")).scalar_one()
            queued = conn.execute(sa.select(sa.func.count()).where(t.outbox.c.kind == "run")).scalar_one()
        assert traced + queued == finals.total()


def test_random_transitions_keep_every_invariant(tmp_path: Path) -> None:
    """K2-K6: under random legal, illegal, stale, fenced and interrupted moves, the store matches the SPEC."""
    template = tmp_path / "template.db"
    SqlStore.open(str(template)).close()
    assert not Path(f"{template}-wal").exists() or Path(f"{template}-wal").stat().st_size == 0
    run_state_machine_as_test(lambda: RunLifecycle(template), settings=SETTINGS)
