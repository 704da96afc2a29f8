"""Several OS processes racing to decide the same Runs on one SQLite file (SPEC K3, K4, K6, K8, A3).

Each worker process opens its own SqlStore and tries its decision on every Run, in its own random order,
all starting together. For every Run exactly one decision wins; every loser gets a lost-race result and
its attempt is in the audit log; nobody sees "database is locked"; the chain stays linear.

The helpers `assert_chain_intact` and `assert_runs_consistent` are shared with the crash and chain tests.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import random
import traceback
from collections import Counter
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from harness.adapters.sql import schema as t
from harness.adapters.sql.store import SqlStore
from harness.domain.chain import GENESIS_HASH, record_hash
from harness.domain.records import NewRun
from harness.drive.state_machine import StateMachine
from harness.kernel.events import FINAL_EVENT
from harness.kernel.projection import job_status
from harness.kernel.states import FINAL, RunState
from harness.kernel.transitions import LEGAL

pytestmark = pytest.mark.slow
#: SQLite here; test_races_servers.py runs these tests on PostgreSQL and MariaDB
BACKENDS = ("sqlite",)

S = RunState
RUNS_PER_SCENARIO = 120
TO_AWAITING_HITL = [S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.AWAITING_HITL]
TO_EXECUTING = [S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING]
CANCELLABLE = {S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.AWAITING_HITL, S.EXECUTING}

#: decision name -> the moves its worker makes, in order, while it keeps winning
PLANS: dict[str, list[tuple[RunState, RunState]]] = {
    "hitl_timeout": [(S.AWAITING_HITL, S.TIMEOUT)],
    "approve": [(S.AWAITING_HITL, S.EXECUTING), (S.EXECUTING, S.TRACING)],
    "succeed": [(S.EXECUTING, S.TRACING)],
    "exec_timeout": [(S.EXECUTING, S.TIMEOUT)],
}


# ---------------------------------------------------------------------------------------- shared checks


def assert_chain_intact(store: SqlStore) -> int:
    """The chain links record to record from genesis with contiguous seq, recomputable hashes, no fork,
    and the head row names its last record. Returns the chain length."""
    prev, seq = GENESIS_HASH, 0
    for rec in store.iter_trace():
        seq += 1
        assert rec.seq == seq, f"seq gap before {rec.seq}"
        assert rec.prev_hash == prev, f"record {rec.seq} does not link to its predecessor"
        recomputed = record_hash(rec.seq, rec.record_id, rec.run_id, rec.kind, rec.prev_hash, rec.payload)
        assert rec.hash == recomputed, f"record {rec.seq} was altered"
        prev = rec.hash
    assert store.chain_head() == (seq, prev)
    with store.engine.connect() as conn:
        forks = conn.execute(
            sa.select(t.trace_records.c.prev_hash)
            .group_by(t.trace_records.c.prev_hash)
            .having(sa.func.count() > 1)
        ).all()
    assert forks == [], "two records share a previous hash"
    return seq


def records_by_kind(store: SqlStore) -> dict[str, list[tuple[str | None, dict[str, Any]]]]:
    """Every trace record, chained or still in the outbox, as (run_id, payload) grouped by kind."""
    found: dict[str, list[tuple[str | None, dict[str, Any]]]] = {}
    with store.engine.connect() as conn:
        for table in (t.trace_records, t.outbox):
            for row in conn.execute(sa.select(table.c.run_id, table.c.kind, table.c.payload)):
                found.setdefault(row.kind, []).append((row.run_id, json.loads(row.payload)))
    return found


def assert_runs_consistent(store: SqlStore) -> dict[str, list[RunState]]:
    """Every Run agrees with its transition rows, its legacy job row and its trace records, and every
    committed transition and audit event has its trace record (chained or queued) and nothing else does.
    Returns each Run's path."""
    paths: dict[str, list[RunState]] = {}
    with store.engine.connect() as conn:
        runs = conn.execute(sa.select(t.runs.c.run_id, t.runs.c.state, t.runs.c.version)).all()
        rows = conn.execute(
            sa.select(t.transitions.c.run_id, t.transitions.c.seq, t.transitions.c.from_state,
                      t.transitions.c.to_state).order_by(t.transitions.c.run_id, t.transitions.c.seq)
        ).all()
        jobs = {r.job_id: (r.status, r.run_state_snapshot) for r in conn.execute(sa.select(t.jobs))}
        event_ids = set(conn.execute(sa.select(t.audit_events.c.event_id)).scalars())
    by_run: dict[str, list[Any]] = {}
    for r in rows:
        by_run.setdefault(r.run_id, []).append(r)
    for run in runs:
        mine = by_run.get(run.run_id, [])
        assert [r.seq for r in mine] == list(range(run.version + 1)), run.run_id
        assert mine[0].from_state is None and mine[0].to_state == S.CREATED
        for before, after in pairwise(mine):
            assert after.from_state == before.to_state
            assert (S(after.from_state), S(after.to_state)) in LEGAL
        path = [S(r.to_state) for r in mine]
        assert path[-1] == run.state
        assert [i for i, s in enumerate(path) if s in FINAL] in ([], [len(path) - 1]), "a final state changed"
        assert path[-1] not in FINAL or path[-2] == S.TRACING, "a final state entered without TRACING"
        assert jobs[run.run_id] == (job_status(S(run.state)).value, run.state)
        paths[run.run_id] = path
    assert set(jobs) == set(paths)
    records = records_by_kind(store)
    transition_records = Counter((run_id, p["seq"]) for run_id, p in records.get("transition", []))
    assert transition_records == Counter((r.run_id, r.seq) for r in rows)
    audit_records = Counter(p["event_id"] for _, p in records.get("audit", []))
    assert audit_records == Counter(event_ids)
    run_traces = Counter(run_id for run_id, _ in records.get("run", []))
    assert run_traces == Counter(run_id for run_id, path in paths.items() if path[-1] in FINAL)
    for final, event in FINAL_EVENT.items():  # K8 reconciliation
        assert len(store.audit_events(event=event)) == sum(1 for p in paths.values() if p[-1] == final)
    return paths


def start_forked(store: SqlStore, *processes: Any) -> None:
    """Start forked child processes. The parent's pooled SQLite connections are closed first: a
    connection must not cross a fork, or parent and child would share its file locks."""
    store.engine.dispose()
    for process in processes:
        process.start()


def expected_records(store: SqlStore) -> int:
    """How many trace records the committed state requires: one per transition row, one per audit
    event, one RunTrace per closed Run."""
    with store.engine.connect() as conn:
        transitions = conn.execute(sa.select(sa.func.count()).select_from(t.transitions)).scalar_one()
        events = conn.execute(sa.select(sa.func.count()).select_from(t.audit_events)).scalar_one()
        closed = conn.execute(
            sa.select(sa.func.count()).where(t.runs.c.state.in_([s.value for s in FINAL]))
        ).scalar_one()
    return int(transitions + events + closed)


# ---------------------------------------------------------------------------------------- the workers


def _race_worker(job: dict[str, Any], start: Any) -> None:
    """One process: try its decision on every Run, in its own shuffled order, once every worker is ready."""
    db, decision, seen, run_ids, seed, out = (
        job["db"], job["decision"], job["seen"], job["run_ids"], job["seed"], job["out"]
    )
    attempts: list[list[Any]] = []
    errors: list[str] = []
    store = SqlStore.open(db, migrate_schema=False)
    machine = StateMachine(store)
    order = list(run_ids)
    random.Random(seed).shuffle(order)
    start.wait()
    for run_id in order:
        try:
            if decision == "cancel":
                _cancel(machine, run_id, S(seen), attempts)
            else:
                for source, target in PLANS[decision]:
                    outcome = machine.transition(run_id, source, target, actor=decision, reason=decision)
                    attempts.append([run_id, source, target, outcome.applied])
                    if not outcome.applied:
                        break
        except Exception:
            errors.append(traceback.format_exc())
    store.close()
    Path(out).write_text(json.dumps({"attempts": attempts, "errors": errors}))


def _cancel(machine: StateMachine, run_id: str, seen: RunState, attempts: list[list[Any]]) -> None:
    """A user's cancel: aimed at the state the user saw, retried once from where the Run turned out to be."""
    for _ in range(2):
        if seen not in CANCELLABLE:
            return
        outcome = machine.transition(run_id, seen, S.CANCELLED, actor="cancel", reason="user cancel")
        attempts.append([run_id, seen, S.CANCELLED, outcome.applied])
        if outcome.applied:
            return
        seen = outcome.actual


# ---------------------------------------------------------------------------------------- the races


def _prepare(store: SqlStore, path: list[RunState], count: int) -> list[str]:
    run_ids = []
    for i in range(count):
        run, _ = store.create_run(NewRun("acme", "alice", f"s{i}", {"task": i}))
        source = S.CREATED
        for target in path:
            assert store.transition(run.run_id, source, target, actor="setup", reason="setup").applied
            source = target
        run_ids.append(run.run_id)
    return run_ids


def _race(db: str, tmp_path: Path, path: list[RunState],
          decisions: list[str]) -> tuple[SqlStore, list[list[Any]]]:
    store = SqlStore.open(db)
    run_ids = _prepare(store, path, RUNS_PER_SCENARIO)
    ctx = mp.get_context("fork")
    start = ctx.Barrier(len(decisions))
    outs = [tmp_path / f"{d}.json" for d in decisions]
    workers = [
        ctx.Process(target=_race_worker, args=({
            "db": db, "decision": d, "seen": path[-1].value, "run_ids": run_ids, "seed": seed, "out": str(out)
        }, start))
        for seed, (d, out) in enumerate(zip(decisions, outs, strict=True))
    ]
    start_forked(store, *workers)
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0] * len(workers)
    attempts: list[list[Any]] = []
    for out in outs:
        report = json.loads(out.read_text())
        assert report["errors"] == [], report["errors"][0]
        attempts.extend(report["attempts"])
    return store, attempts


def _assert_race_outcome(store: SqlStore, attempts: list[list[Any]], decisions: list[str]) -> Counter[str]:
    """Exactly one final state per Run, every decision recorded, the chain linear. Returns the winners."""
    store.drain_all()
    assert store.outbox_backlog() == 0
    paths = assert_runs_consistent(store)
    assert len(paths) == RUNS_PER_SCENARIO
    assert all(p[-1] in FINAL for p in paths.values())
    with store.engine.connect() as conn:
        rows = conn.execute(sa.select(t.transitions.c.run_id, t.transitions.c.from_state,
                                      t.transitions.c.to_state, t.transitions.c.actor)).all()
    final_rows = Counter(r.run_id for r in rows if r.to_state in FINAL)
    assert set(final_rows.values()) == {1}, "a Run has more than one final-state transition"
    won = Counter((run_id, S(src), S(dst)) for run_id, src, dst, applied in attempts if applied)
    assert won == Counter((r.run_id, S(r.from_state), S(r.to_state)) for r in rows if r.actor in decisions)
    lost = Counter((run_id, S(src), S(dst)) for run_id, src, dst, applied in attempts if not applied)
    events = store.audit_events(event="transition_lost_race")
    assert lost == Counter(
        (e.run_id, S(e.detail["attempted_from"]), S(e.detail["attempted_to"])) for e in events
    )
    assert all(e.actor in decisions for e in events)
    losers = Counter(run_id for run_id, *_ , applied in attempts if not applied)
    assert all(losers[run_id] >= len(decisions) - 1 for run_id in paths), "a decision left no trace"
    assert assert_chain_intact(store) == expected_records(store)
    return Counter(p[-1] for p in paths.values())


def test_cancel_races_hitl_timeout(backend_url: str, tmp_path: Path) -> None:
    """K4: user cancel vs HITL timeout on AWAITING_HITL: one winner per Run, the loser's attempt audited."""
    store, attempts = _race(backend_url, tmp_path, TO_AWAITING_HITL, ["cancel", "hitl_timeout"])
    try:
        finals = _assert_race_outcome(store, attempts, ["cancel", "hitl_timeout"])
        assert set(finals) <= {S.CLOSED_CANCELLED, S.CLOSED_REJECTED}  # HITL timeout is default-deny
    finally:
        store.close()


def test_approve_races_cancel(backend_url: str, tmp_path: Path) -> None:
    """K4: approve vs cancel on AWAITING_HITL (and cancel vs success after an approval) never double-close."""
    store, attempts = _race(backend_url, tmp_path, TO_AWAITING_HITL, ["approve", "cancel"])
    try:
        finals = _assert_race_outcome(store, attempts, ["approve", "cancel"])
        assert set(finals) <= {S.SUCCEEDED, S.CLOSED_CANCELLED}
    finally:
        store.close()


def test_success_races_cancel_and_execution_timeout(backend_url: str, tmp_path: Path) -> None:
    """K4: success vs cancel vs execution timeout on EXECUTING: one winner, two audited losers per Run."""
    decisions = ["succeed", "cancel", "exec_timeout"]
    store, attempts = _race(backend_url, tmp_path, TO_EXECUTING, decisions)
    try:
        finals = _assert_race_outcome(store, attempts, decisions)
        assert set(finals) <= {S.SUCCEEDED, S.CLOSED_CANCELLED, S.CLOSED_FAILED}
    finally:
        store.close()
