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
from typing import Any

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
from harness.adapters.sql.store import SqlStore
from harness.clock import FakeClock
from harness.domain.chain import GENESIS_HASH, record_hash
from harness.domain.errors import InvalidTransitionError
from harness.domain.records import NewRun
from harness.drive.state_machine import StateMachine
from harness.kernel.events import FINAL_EVENT
from harness.kernel.projection import job_status
from harness.kernel.states import FINAL, TRANSIENT, RunState
from harness.kernel.transitions import LEGAL, targets_from

S = RunState
SETTINGS = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
MAIN_PATH = [S.CREATED, S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.AWAITING_HITL, S.EXECUTING]
EXITS_FROM_MAIN_PATH = sorted((s, t) for s, t in LEGAL if s in MAIN_PATH)
VIA = [S.EXECUTING, S.AWAITING_HITL]  # the two ways from POLICY_CHECK into EXECUTING
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
        self.touched: set[str] = set()

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def state(self, run_id: str) -> RunState:
        """The model's state of a Run this step works on (which the next check reads back in full)."""
        self.touched.add(run_id)
        return self.paths[run_id][-1]

    # ------------------------------------------------------------------ rules

    def _create(self) -> str:
        run, created = self.store.create_run(NewRun("tenant", "user", "session", {"task": len(self.paths)}))
        assert created
        self.paths[run.run_id] = [S.CREATED]
        return run.run_id

    @initialize(target=runs, edges=st.lists(st.sampled_from(EXITS_FROM_MAIN_PATH), min_size=2, max_size=2))
    def first_runs(self, edges: list[tuple[RunState, RunState]]) -> MultipleResults[str]:
        run_ids = [self._create() for _ in edges]
        for run_id, edge in zip(run_ids, edges, strict=True):
            self._walk_then_take(run_id, edge, S.AWAITING_HITL)
        return multiple(*run_ids)

    @precondition(lambda self: len(self.paths) < 6)
    @rule(target=runs, edge=st.sampled_from(EXITS_FROM_MAIN_PATH), via=st.sampled_from(VIA))
    def create(self, edge: tuple[RunState, RunState], via: RunState) -> str:
        """A new Run, walked along the main path to the edge's source, then across the edge."""
        run_id = self._create()
        self._walk_then_take(run_id, edge, via)
        return run_id

    def _move(self, run_id: str, target: RunState) -> None:
        cur = self.state(run_id)
        outcome = self.machine.transition(run_id, cur, target, actor="test", reason="legal move")
        assert outcome.applied and not outcome.fenced
        self.paths[run_id].append(target)
        funnel(self.paths[run_id])

    def _walk_then_take(
        self, run_id: str, edge: tuple[RunState, RunState], via: RunState, *, die: bool = False
    ) -> None:
        source, target = edge
        cur = self.state(run_id)
        if cur not in MAIN_PATH or MAIN_PATH.index(cur) > MAIN_PATH.index(source):
            return
        while (cur := self.state(run_id)) != source:
            via_hitl = cur == S.POLICY_CHECK and source == S.EXECUTING
            self._move(run_id, via if via_hitl else MAIN_PATH[MAIN_PATH.index(cur) + 1])
        if die:
            # the worker commits the move and dies before the funnel: the Run may sit in a transient state
            outcome = self.store.transition(run_id, source, target, actor="dying-worker", reason="crashed")
            assert outcome.applied
            self.paths[run_id].append(target)
        else:
            self._move(run_id, target)

    @rule(run_id=runs, edge=st.sampled_from(EXITS_FROM_MAIN_PATH), via=st.sampled_from(VIA))
    def walk_then_take(self, run_id: str, edge: tuple[RunState, RunState], via: RunState) -> None:
        """Walk the main path up to the edge's source, then take the edge: every edge gets exercised."""
        self._walk_then_take(run_id, edge, via)

    @rule(run_id=runs, edge=st.sampled_from(EXITS_FROM_MAIN_PATH), via=st.sampled_from(VIA))
    def walk_then_die(self, run_id: str, edge: tuple[RunState, RunState], via: RunState) -> None:
        """As walk_then_take, but the last move is committed by a worker that dies before the funnel."""
        self._walk_then_take(run_id, edge, via, die=True)

    @rule(run_id=runs, data=st.data(), moves=st.integers(min_value=1, max_value=3))
    def legal_moves(self, run_id: str, data: st.DataObject, moves: int) -> None:
        for _ in range(moves):
            cur = self.state(run_id)
            targets = sorted(targets_from(cur) - FINAL)  # TRACING's exit is the kernel's, never a caller's
            if not targets:
                return
            self._move(run_id, data.draw(st.sampled_from(targets), label="target"))

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
        """Every Run, not only the ones just moved, has the model's state, path, version and projection;
        the Runs the step worked on are also read back through the store's own read API."""
        with self.store.engine.connect() as conn:
            runs = {r.run_id: (r.state, r.version)
                    for r in conn.execute(sa.select(t.runs.c.run_id, t.runs.c.state, t.runs.c.version))}
            jobs = {r.job_id: (r.status, r.run_state_snapshot) for r in conn.execute(sa.select(t.jobs))}
            rows: dict[str, list[sa.Row[Any]]] = {}
            ordered = sa.select(t.transitions).order_by(t.transitions.c.run_id, t.transitions.c.seq)
            for r in conn.execute(ordered):
                rows.setdefault(r.run_id, []).append(r)
        assert set(runs) == set(jobs) == set(rows) == set(self.paths)
        for run_id, path in self.paths.items():
            assert runs[run_id] == (path[-1], len(path) - 1)
            assert jobs[run_id] == (job_status(path[-1]).value, path[-1].value)
            assert [(r.seq, r.to_state) for r in rows[run_id]] == list(enumerate(path))
            assert [r.from_state for r in rows[run_id]] == [None, *path[:-1]]
        for run_id in self.touched:
            self.check_run(run_id)
        self.touched.clear()

    def check_run(self, run_id: str) -> None:
        """The stored Run, its legacy job row and its transition rows say what the model says."""
        path = self.paths[run_id]
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
            assert all(pair in LEGAL for pair in pairwise(path))

    @invariant()
    def every_attempt_and_every_closing_is_audited(self) -> None:
        """Illegal and lost attempts are each audited (K2, K4); closed Runs reconcile with their final
        events (K8) and each carries exactly one RunTrace (A1)."""
        event = t.audit_events.c.event
        with self.store.engine.connect() as conn:
            grouped = conn.execute(sa.select(event, sa.func.count()).group_by(event)).all()
            counts: Counter[str] = Counter({name: n for name, n in grouped})
            fenced = conn.execute(sa.select(sa.func.count()).where(
                event == "transition_lost_race", t.audit_events.c.detail.contains('"fenced":true')
            )).scalar_one()
            run_traces = sum(
                conn.execute(sa.select(sa.func.count()).where(table.c.kind == "run")).scalar_one()
                for table in (t.trace_records, t.outbox)
            )
        assert counts["illegal_transition"] == self.illegal
        assert counts["transition_lost_race"] == self.lost
        assert fenced == self.fenced
        finals = Counter(path[-1] for path in self.paths.values() if path[-1] in FINAL)
        assert {e: counts[e] for e in FINAL_EVENT.values()} == {e: finals[f] for f, e in FINAL_EVENT.items()}
        assert run_traces == finals.total()


def test_random_transitions_keep_every_invariant(tmp_path: Path) -> None:
    """K2-K6: under random legal, illegal, stale, fenced and interrupted moves, the store matches the SPEC."""
    template = tmp_path / "template.db"
    SqlStore.open(str(template)).close()
    assert not Path(f"{template}-wal").exists() or Path(f"{template}-wal").stat().st_size == 0
    class OnTemplate(RunLifecycle):
        def __init__(self) -> None:
            super().__init__(template)

    run_state_machine_as_test(OnTemplate, settings=SETTINGS)


def test_every_exit_from_the_main_path_keeps_every_invariant(tmp_path: Path) -> None:
    """K2-K6: every edge out of the main path, taken whole or interrupted then recovered, matches the SPEC."""
    template = tmp_path / "template.db"
    SqlStore.open(str(template)).close()
    lifecycle = RunLifecycle(template)
    try:
        for edge in EXITS_FROM_MAIN_PATH:
            for via in VIA:
                lifecycle._walk_then_take(lifecycle._create(), edge, via)
                interrupted = lifecycle._create()
                lifecycle._walk_then_take(interrupted, edge, via, die=True)
                lifecycle.check_run(interrupted)
                if lifecycle.state(interrupted) == S.TRACING and via == S.AWAITING_HITL:
                    lifecycle._move(interrupted, S.FAILED)  # the sweeper: trace write stuck
                lifecycle.recover(interrupted)
        lifecycle.store_agrees_with_the_model()
        lifecycle.final_states_are_entered_once_and_only_from_tracing()
        lifecycle.every_attempt_and_every_closing_is_audited()
        lifecycle.drain()
        assert {path[-1] for path in lifecycle.paths.values()} >= set(FINAL)
    finally:
        lifecycle.teardown()


def test_a_run_that_left_tracing_and_came_back_is_not_closed_on_its_old_reason(tmp_path: Path) -> None:
    """K3/K4: a close racing the sweeper's TRACING→FAILED→TRACING is a lost race; the Run closes failed."""
    store = SqlStore.open(str(tmp_path / "aba.db"))
    machine = StateMachine(store, drain_on_close=False)
    try:
        run, _ = store.create_run(NewRun("tenant", "user", "session", {}))
        for source, target in pairwise([*MAIN_PATH[:4], S.EXECUTING, S.TRACING]):
            store.transition(run.run_id, source, target, actor="worker", reason="then paused")

        swept: list[bool] = []

        def sweeper_meanwhile(_run: Any, _final: RunState) -> list[Any]:
            # runs after the closing worker read the Run (close reason: success), before its CAS
            if not swept:
                swept.append(True)
                store.transition(run.run_id, S.TRACING, S.FAILED, actor="sweeper", reason="trace write stuck",
                                 forced_by="zombie_sweeper")
                store.transition(run.run_id, S.FAILED, S.TRACING, actor="kernel", reason="funnel",
                                 forced_by="zombie_sweeper")
            return []

        machine.on_close(sweeper_meanwhile)
        # the paused worker resumes its close and loses the race: it stops, without error (advance's contract)
        assert machine.advance(run.run_id, S.TRACING) == S.TRACING
        assert len(store.audit_events(run_id=run.run_id, event="transition_lost_race")) == 1
        assert store.audit_events(event="illegal_transition") == []  # the kernel never attempts one
        machine.advance(run.run_id, S.TRACING, forced_by="zombie_sweeper")
        path = [r.to_state for r in store.transitions_of(run.run_id)]
        assert path[-4:] == [S.TRACING, S.FAILED, S.TRACING, S.CLOSED_FAILED]
    finally:
        store.close()
