"""Durable at effect boundaries: a drive commits when a Run is accepted, before anything leaves the
process, when it parks and when it closes — not at every transition — and after a crash the Run resumes
from its last committed boundary, as if the crash had come a moment earlier."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.store import SqlStore
from harness.audit.verify import verify_chain
from harness.config import Runtime, build_runtime
from harness.domain.errors import InvalidRequestError
from harness.drive.worker import RunWorker
from harness.kernel.states import RunState
from harness.settings import Settings
from tests.integration.test_worker import _kill_during_call, calls, settings

TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}
BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "fixtures" / "bench_rules.yaml"
#: the bundled example's shape: two read-only lookups, then a note (not idempotent)
PLAIN = {"task": "bench A-1001", "user_id": "alice", "roles": ["support_agent"]}


def _commits(rt: Runtime) -> list[int]:
    """A counter of the commits made on the runtime's database from now on."""
    seen: list[int] = []
    sa.event.listen(rt.store.engine, "commit", lambda _conn: seen.append(1))
    return seen


def _example(tmp: Path, db: str | None = None, **settings: Any) -> Runtime:
    from harness.examples.support import EXAMPLE_DIR

    return build_runtime(Settings(db=db or str(tmp / "ex.db"), data_dir=tmp / "data", llm_rules=BENCH,
                                  identities_file=EXAMPLE_DIR / "identities.yaml", **settings))


def test_a_plain_run_commits_at_its_effect_boundaries_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           ) -> None:
    """The bundled example's order-status Run (two read-only lookups, then a note that is not idempotent),
    asked for and driven in one call, makes 4 commits: its acceptance with its lease, CREATED→PREPARING and
    PREPARING→PLANNING, before the model (its context was assembled before anything was written, and its
    caller gets its id only with its result); the plan through EXECUTING, before the first call; the
    lookups' results with the note's started mark, before the note; the note's result with the close and
    the lease's release. One commit per write makes 13."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    rt = _example(tmp_path)
    try:
        rt.runs.create_run(PLAIN)  # warm the caches
        commits = _commits(rt)
        result = rt.runs.create_run(PLAIN)
        assert result.state == "SUCCEEDED", result
        assert len(commits) == 4
        path = [t.to_state.value for t in rt.store.transitions_of(result.run_id)]
        assert path == ["CREATED", "PREPARING", "PLANNING", "POLICY_CHECK", "EXECUTING", "TRACING", "SUCCEEDED"]
        assert rt.store.get_run(result.run_id).lease_owner is None
    finally:
        rt.close()
    monkeypatch.setenv("HARNESS_COMMIT_MODE", "transition")
    (tmp_path / "per-transition").mkdir()
    rt = _example(tmp_path / "per-transition")
    try:
        rt.runs.create_run(PLAIN)
        commits = _commits(rt)
        assert rt.runs.create_run(PLAIN).state == "SUCCEEDED"
        assert len(commits) >= 13
    finally:
        rt.close()


def test_results_waiting_for_one_transaction_are_saved_together(backend_url: str, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The two read-only lookups' results wait for the note's started mark (nothing leaves the process
    before it): their records and contents are written in one save, in the mark's transaction, and the
    RunContext once, by the mark, with both results in it (not first as of the lookups, only to be
    replaced in the same transaction); the note's result is the other save. Every step's ToolTrace is
    chained and each result's content is stored (replay reads them by hash)."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    rt = _example(tmp_path, backend_url)
    saves: list[tuple[list[str] | None, int, int]] = []
    marks: list[list[str]] = []
    real, real_mark = rt.runs.writes.save_context, rt.store.mark_step_started

    def counted(run_id: str, context: dict[str, Any] | None, records: Any, values: Any, **kwargs: Any) -> bool:
        values = tuple(values)
        saves.append((None if context is None else sorted(context.get("steps", {})), len(records), len(values)))
        return real(run_id, context, records, values, **kwargs)

    def marked(run_id: str, step_id: str, context: dict[str, Any], **kwargs: Any) -> str | None:
        marks.append(sorted(context["steps"]))
        return real_mark(run_id, step_id, context, **kwargs)

    try:
        rt.runs.writes.save_context = counted  # type: ignore[method-assign]
        monkeypatch.setattr(rt.store, "mark_step_started", marked)
        result = rt.runs.create_run(PLAIN)
        assert result.state == "SUCCEEDED", result
        steps = sorted((rt.store.get_run(result.run_id).context or {})["steps"])
        assert len(steps) == 3 and len(saves) == 2, saves
        lookups, note = saves
        assert lookups[0] is None and lookups[1] == 2 and lookups[2] == 4  # both lookups: arguments, outputs
        assert marks == [steps]  # the note's mark writes the RunContext with both lookups' results
        assert note[0] == steps
        rt.store.drain_all()
        tools = [r for r in rt.store.trace_of(result.run_id) if r.kind == "tool"]
        assert len(tools) == 3
        assert verify_chain(SqlAuditReads(rt.store)).ok
    finally:
        rt.close()


def test_results_waiting_for_a_refused_started_mark_are_saved_with_their_context(
        backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled while the lookups' results wait, the Run refuses the note's started mark (it left
    EXECUTING): the mark writes nothing, and the lookups' records, contents and RunContext are saved all the
    same, so the calls that ran keep their trace and the note never runs."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    rt = _example(tmp_path, backend_url)
    real_mark = rt.store.mark_step_started
    refusals: list[str | None] = []

    def cancelled_first(run_id: str, step_id: str, context: dict[str, Any], **kwargs: Any) -> str | None:
        # another caller's cancel, on its own connection and thread, lands just before the mark
        canceller = threading.Thread(target=rt.runs.cancel, args=(run_id,), kwargs={"by": "tess"})
        canceller.start()
        canceller.join(30)
        refusals.append(real_mark(run_id, step_id, context, **kwargs))
        return refusals[-1]

    try:
        monkeypatch.setattr(rt.store, "mark_step_started", cancelled_first)
        result = rt.runs.create_run(PLAIN)
        assert result.state == "CLOSED_CANCELLED", result
        assert refusals == ["superseded"]
        steps = (rt.store.get_run(result.run_id).context or {})["steps"]
        assert sorted(steps) == ["customer", "lookup"] and all(s["status"] == "ok" for s in steps.values()), steps
        rt.store.drain_all()
        tools = [r for r in rt.store.trace_of(result.run_id) if r.kind == "tool"]
        assert len(tools) == 2
        assert verify_chain(SqlAuditReads(rt.store)).ok
        assert not (tmp_path / "ledger.jsonl").exists() or "status asked" not in (tmp_path / "ledger.jsonl").read_text()
    finally:
        rt.close()


def test_only_the_drives_own_thread_joins_its_unit(tmp_path: Path) -> None:
    """A started mark carries waiting results only where it and their records commit together: on the
    drive's thread, in its unit. A parallel step's thread, an effect and code outside a drive do not join
    (their writes commit one by one), so a mark made there leaves the waiting results to their own save."""
    store = SqlStore.open(str(tmp_path / "units.db"))
    try:
        assert not store.joined()
        with store.unit("run-1"):
            assert store.joined()
            seen: list[bool] = []
            other = threading.Thread(target=lambda: seen.append(store.joined()))
            other.start()
            other.join(10)
            assert seen == [False]
            with store.effect():
                assert not store.joined()
            assert store.joined()
        assert not store.joined()
    finally:
        store.close()


def _dying_at(tmp: str, db: str, at: str) -> Runtime:
    """The example's runtime in this (child) process, SIGKILLed as a transition to `at` is written (before
    its transaction commits)."""
    os.environ["HARNESS_EXAMPLE_LEDGER"] = str(Path(tmp) / "ledger.jsonl")
    rt = _example(Path(tmp), db)

    def die(_run_id: str, _source: RunState, target: RunState) -> None:
        if target == RunState(at):
            os.kill(os.getpid(), signal.SIGKILL)

    rt.machine.subscribe(die, at_commit=False)
    return rt


def _kill_before_the_first_commit(tmp: str, db: str, at: str) -> None:
    _dying_at(tmp, db, at).runs.create_run(PLAIN)  # accepted, leased, transitioned: nothing committed yet


@pytest.mark.parametrize("at", ["PREPARING", "PLANNING"])
def test_a_run_asked_for_and_killed_before_its_first_commit_leaves_nothing(backend_url: str, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch,
                                                                          at: str) -> None:
    """The process that asked for a Run and drives it is killed after the Run was accepted, leased and
    moved to PREPARING, or on to PLANNING with its context (the model not yet called), before that one
    transaction committed: no Run, transition, audit event or trace record is left, the chain verifies,
    and the next request is served. Its caller never had its id."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    _example(tmp_path, backend_url).close()  # migrated before the child starts
    proc = mp.get_context("spawn").Process(target=_kill_before_the_first_commit,
                                           args=(str(tmp_path), backend_url, at))
    proc.start()
    proc.join(120)
    assert proc.exitcode == -signal.SIGKILL
    rt = _example(tmp_path, backend_url)
    try:
        with rt.store.engine.connect() as conn:
            for table in ("runs", "transitions", "audit_events", "outbox", "trace_records"):
                assert conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar() == 0, table
        assert verify_chain(SqlAuditReads(rt.store)).ok
        assert rt.runs.create_run(PLAIN).state == "SUCCEEDED"
    finally:
        rt.close()


def test_a_wrong_commit_mode_is_refused_naming_the_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_COMMIT_MODE", "sometimes")
    with pytest.raises(InvalidRequestError, match="HARNESS_COMMIT_MODE must be one of boundaries, transition"):
        SqlStore.open(str(tmp_path / "x.db"))


def test_listeners_are_told_once_other_connections_see_the_change(backend_url: str, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A listener that wakes another process or thread finds the change there: when it is told, a reader
    on another engine already sees the transition (every state, on every backend)."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    rt = _example(tmp_path, backend_url)
    outside = SqlStore.open(backend_url)
    told: list[tuple[str, list[str]]] = []
    try:
        rt.machine.subscribe(lambda run_id, _s, target: told.append(
            (target.value, [t.to_state.value for t in outside.transitions_of(run_id)])))
        result = rt.runs.create_run(PLAIN)
        assert result.state == "SUCCEEDED"
        assert [t for t, _ in told] == ["PREPARING", "PLANNING", "POLICY_CHECK", "EXECUTING", "TRACING", "SUCCEEDED"]
        for target, seen in told:
            assert target in seen, (target, seen)
    finally:
        outside.close()
        rt.close()


def test_a_worker_killed_between_boundaries_resumes_from_the_last_one(backend_url: str, tmp_path: Path,
                                                                     call_log: Path) -> None:
    """Killed inside a read-only call whose predecessor's result had not committed yet (it rides with the
    next boundary), the worker leaves the Run as the boundary before the first call left it: EXECUTING,
    with no step recorded. The next worker runs both calls again — harmless, they only read — and
    succeeds; nothing recorded is lost, because nothing that changed anything happened since. On every
    backend: on PostgreSQL the writes the killed worker had queued for its next statement were never
    sent, and are lost exactly as an uncommitted transaction's are."""
    run_id = _kill_during_call(tmp_path, call_log, "peek twice 3", backend_url)
    rt = build_runtime(settings(tmp_path, backend_url))
    try:
        stored = rt.store.get_run(run_id)
        assert stored.state == RunState.EXECUTING
        assert (stored.context or {}).get("steps") == {}
        result = RunWorker(rt, owner="rescuer").execute(run_id)
        assert result is not None
        assert result.state == "SUCCEEDED", result.error
        starts = [c["step"] for c in calls(call_log) if c["skill"] == "test.peek" and c["phase"] == "start"]
        assert starts == ["a", "b", "a", "b"]
        rt.store.drain_all()
        assert verify_chain(SqlAuditReads(rt.store)).ok  # the dead worker's lost writes left no hole
    finally:
        rt.close()


def _kill_at_note(tmp: str, db: str, log: str, run_id: str) -> None:
    os.environ["HARNESS_TEST_CALL_LOG"] = log
    rt = build_runtime(settings(Path(tmp), db))
    real = rt.runs.tools.call

    def die(*args: Any, **kwargs: Any) -> Any:
        if kwargs["step_id"] == "b":  # the started mark of b (not idempotent) has committed by now
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)

    rt.runs.tools.call = die  # type: ignore[method-assign]
    RunWorker(rt, owner="doomed", ttl_s=1.0).execute(run_id)


def test_a_non_idempotent_calls_started_mark_commits_before_the_call(backend_url: str, tmp_path: Path,
                                                                     call_log: Path) -> None:
    """Killed as a call that is not idempotent starts, the worker has already committed the call's
    "started" mark and the result of the step before it: the next worker does not run it again."""
    rt = build_runtime(settings(tmp_path, backend_url))
    run, _ = rt.runs.submit({"task": "hang 0.01", **TESS})
    rt.close()
    proc = mp.get_context("spawn").Process(target=_kill_at_note,
                                           args=(str(tmp_path), backend_url, str(call_log), run.run_id))
    proc.start()
    proc.join(120)
    assert proc.exitcode == -signal.SIGKILL
    time.sleep(1.2)  # the dead worker's lease (1 s) lapses
    rt = build_runtime(settings(tmp_path, backend_url))
    try:
        steps = (rt.store.get_run(run.run_id).context or {}).get("steps", {})
        assert steps["a"]["status"] == "ok" and steps["b"]["status"] == "started"
        result = RunWorker(rt, owner="rescuer").execute(run.run_id)
        assert result is not None and result.state == "CLOSED_FAILED"
        assert "outcome of b unknown" in (result.error or "")
        assert [c["step"] for c in calls(call_log) if c["skill"] == "test.echo"] == ["a"]
    finally:
        rt.close()


@pytest.mark.parametrize("how", ["worker", "create_run"])
def test_a_heartbeat_during_the_closing_transaction_does_not_stall_the_drive(
        backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """A heartbeat that fires while the drive's last transaction is open waits for the Run's row that
    transaction holds. The drive ends without waiting for it in turn: before, it joined the heartbeat
    before committing, which waited out SQLite's busy timeout (60 s) and MariaDB's lock wait (50 s), and
    on PostgreSQL for ever. Here the close is held open across several heartbeat intervals; a worker
    drives the Run, or the call that asks for it (whose acceptance opened the unit of work the drive
    joins: the drive commits it before it waits)."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    rt = _example(tmp_path, backend_url, lease_ttl_s=1.5)
    closing: list[float] = []

    def slow_close(_run_id: str, _source: RunState, target: RunState) -> None:
        if target == RunState.SUCCEEDED:  # inside the drive's last transaction, before its commit
            closing.append(time.monotonic())
            time.sleep(1.2)  # the heartbeat (every 0.5 s) fires meanwhile and waits for the Run's row

    errors: list[BaseException] = []
    outcome: list[Any] = []
    try:
        rt.machine.subscribe(slow_close, at_commit=False)
        worker = RunWorker(rt, owner="w1", ttl_s=1.5)

        def drive() -> None:
            try:
                if how == "worker":
                    run, _ = rt.runs.submit(PLAIN)
                    outcome.append(worker.execute(run.run_id))
                else:
                    outcome.append(rt.runs.create_run(PLAIN))
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=drive, daemon=True)
        started = time.monotonic()
        thread.start()
        thread.join(timeout=40)
        assert not thread.is_alive(), "the drive is stuck behind its own heartbeat"
        assert not errors, errors
        assert closing, "the close was never reached"
        assert time.monotonic() - started < 40
        assert outcome and outcome[0] is not None and outcome[0].state == "SUCCEEDED", outcome
        assert rt.store.get_run(outcome[0].run_id).lease_owner is None
    finally:
        rt.close()


def test_a_step_result_saved_under_a_lease_taken_over_writes_nothing(backend_url: str, tmp_path: Path) -> None:
    """A drive's step result carries its lease's epoch into the write itself (no read of the lease
    before it): once another worker has taken the lease over, the save writes nothing — neither the
    RunContext nor the step's records nor the contents they reference — and says so."""
    from harness.config import open_leases
    from harness.domain.records import TraceRecordIn

    rt = _example(tmp_path, backend_url)
    try:
        run, _ = rt.runs.submit(PLAIN)
        leases = open_leases(rt, 0.05)
        first = leases.acquire(run.run_id, "first")
        assert first is not None
        time.sleep(0.1)  # the first worker stalls past its lease
        second = leases.acquire(run.run_id, "second")
        assert second is not None and second.epoch == first.epoch + 1
        before = rt.store.get_run(run.run_id).context
        with rt.store.engine.connect() as conn:
            blobs = conn.execute(sa.text("SELECT count(*) FROM blobs")).scalar()
        stale = TraceRecordIn("step", {"detail": "from the stalled worker"}, run.run_id, record_id="stale-record")
        saved = rt.runs.writes.save_context(run.run_id, {"steps": {"a": {"status": "done"}}}, [stale],
                                            ["stale content"], lease_epoch=first.epoch)
        assert saved is False
        assert rt.store.get_run(run.run_id).context == before
        with rt.store.engine.connect() as conn:
            ids = {r[0] for r in conn.execute(sa.text(
                "SELECT record_id FROM outbox UNION ALL SELECT record_id FROM trace_records"))}
            assert conn.execute(sa.text("SELECT count(*) FROM blobs")).scalar() == blobs
        assert "stale-record" not in ids
        fresh = TraceRecordIn("step", {"detail": "from the new holder"}, run.run_id, record_id="fresh-record")
        assert rt.runs.writes.save_context(run.run_id, {"steps": {"a": {"status": "done"}}}, [fresh], [],
                                           lease_epoch=second.epoch) is True
        assert rt.store.get_run(run.run_id).context == {"steps": {"a": {"status": "done"}}}
    finally:
        rt.close()


def _standing_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The Run ids whose standing (state and lease, in one read) a drive reads from now on."""
    from harness.adapters.sql.leases import Leases

    read: list[str] = []
    real = Leases.standing

    def counted(self: Leases, lease: Any) -> Any:
        read.append(lease.run_id)
        return real(self, lease)

    monkeypatch.setattr(Leases, "standing", counted)
    return read


def test_the_first_step_after_the_drives_own_move_to_executing_reads_no_standing(
        backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The drive that has just committed POLICY_CHECK→EXECUTING under its lease knows the Run's standing as
    of that commit: its first step does not read it again; the second and the third do. A drive resumed
    in EXECUTING (after an approval) reads it before its first step too."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    rt = _example(tmp_path, backend_url)
    try:
        read = _standing_reads(monkeypatch)
        result = rt.runs.create_run(PLAIN)
        assert result.state == "SUCCEEDED", result
        assert read == [result.run_id] * 2
        parked = rt.runs.create_run({"task": "bench-hitl A-1001", "user_id": "ana", "roles": ["support_agent"]})
        assert parked.state == "AWAITING_HITL", parked
        read.clear()
        # an L2 refund: its requester confirms it
        confirms = rt.identities.resolve("alice").model_copy(update={"user_id": "ana"})
        _, resumed = rt.runs.decide(parked.approval_request_id or "", confirms, "approve")
        assert resumed.state == "SUCCEEDED", resumed
        assert read == [parked.run_id] * 3  # not its own move to EXECUTING: every step reads
    finally:
        rt.close()


def test_a_cancel_landing_as_the_drive_commits_executing_stops_the_run_before_its_side_effect(
        backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled by another runtime on the same database the moment the drive's move to EXECUTING has
    committed: the first lookup may still run (it only reads), the next step finds the Run cancelled and
    nothing after it runs — the note, the one side effect, is never written — and the Run closes
    CANCELLED with a chain that verifies (the lookup's trace, if any, is a record after the close)."""
    ledger = tmp_path / "ledger.jsonl"
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(ledger))
    rt = _example(tmp_path, backend_url)
    other = _example(tmp_path, backend_url)
    cancelled: list[str] = []

    def cancel_at_executing(run_id: str, _source: RunState, target: RunState) -> None:
        if target == RunState.EXECUTING and not cancelled:
            cancelled.append(other.runs.cancel(run_id, by="t1/op", reason="changed my mind").state)

    try:
        rt.runs.create_run(PLAIN)  # one plain Run first: its note is the ledger's only line
        notes = ledger.read_text().splitlines()
        rt.machine.subscribe(cancel_at_executing)  # told once the change has committed
        result = rt.runs.create_run(PLAIN)
        assert cancelled == ["CLOSED_CANCELLED"]
        assert result.state == "CLOSED_CANCELLED", result
        assert ledger.read_text().splitlines() == notes  # no note for the cancelled Run
        steps = (rt.store.get_run(result.run_id).context or {}).get("steps", {})
        assert "note" not in steps and steps.get("customer", {}).get("status") != "ok"
        rt.store.drain_all()
        assert verify_chain(SqlAuditReads(rt.store)).ok
    finally:
        other.close()
        rt.close()


def test_a_fresh_run_handed_to_a_worker_commits_its_lease_through_planning_at_once(
        backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Run accepted on its own (the HTTP API, Celery) and handed to a worker as fresh has its context
    assembled before the lease is taken: the lease, CREATED→PREPARING and PREPARING→PLANNING are one
    commit, so the drive makes 4 (5 without the hint). Handed over as fresh when it is past CREATED (a
    resumed Run), it is driven as ever, after one read."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    rt = _example(tmp_path, backend_url)
    try:
        for fresh, expected in ((True, 4), (False, 5)):
            run, _ = rt.runs.submit(PLAIN)
            commits = _commits(rt)
            result = RunWorker(rt, owner="w1").execute(run.run_id, fresh=fresh)
            assert result is not None and result.state == "SUCCEEDED", result
            assert len(commits) == expected, (fresh, len(commits))
            path = [t.to_state.value for t in rt.store.transitions_of(run.run_id)]
            assert path == ["CREATED", "PREPARING", "PLANNING", "POLICY_CHECK", "EXECUTING", "TRACING", "SUCCEEDED"]
        parked, _ = rt.runs.submit({"task": "bench-hitl A-1001", "user_id": "ana", "roles": ["support_agent"]})
        waiting = RunWorker(rt, owner="w1").execute(parked.run_id, fresh=True)
        assert waiting is not None and waiting.state == "AWAITING_HITL"
        confirms = rt.identities.resolve("alice").model_copy(update={"user_id": "ana"})
        request_id = rt.runs.result(parked.run_id).approval_request_id or ""
        rt.runs.decide(request_id, confirms, "approve", resume=False)
        result = RunWorker(rt, owner="w2").execute(parked.run_id, fresh=True)  # EXECUTING: nothing ahead
        assert result is not None and result.state == "SUCCEEDED", result
        rt.store.drain_all()
        assert verify_chain(SqlAuditReads(rt.store)).ok
    finally:
        rt.close()


def _kill_a_fresh_drive_before_its_first_commit(tmp: str, db: str, run_id: str) -> None:
    rt = _dying_at(tmp, db, "PLANNING")  # leased, PREPARING, PLANNING: nothing of the drive committed yet
    RunWorker(rt, owner="doomed", ttl_s=1.0).execute(run_id, fresh=True)


def test_a_fresh_drive_killed_before_its_first_commit_leaves_the_run_accepted(
        backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Killed after the lease, CREATED→PREPARING and PREPARING→PLANNING, before they committed: the Run is
    as its acceptance left it (CREATED, no lease, its one transition), and the next worker drives it."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    rt = _example(tmp_path, backend_url)
    run, _ = rt.runs.submit(PLAIN)
    rt.close()
    proc = mp.get_context("spawn").Process(target=_kill_a_fresh_drive_before_its_first_commit,
                                           args=(str(tmp_path), backend_url, run.run_id))
    proc.start()
    proc.join(120)
    assert proc.exitcode == -signal.SIGKILL
    rt = _example(tmp_path, backend_url)
    try:
        stored = rt.store.get_run(run.run_id)
        assert stored.state == RunState.CREATED and stored.lease_owner is None
        assert [t.to_state.value for t in rt.store.transitions_of(run.run_id)] == ["CREATED"]
        result = RunWorker(rt, owner="rescuer").execute(run.run_id, fresh=True)
        assert result is not None and result.state == "SUCCEEDED", result
        rt.store.drain_all()
        assert verify_chain(SqlAuditReads(rt.store)).ok
    finally:
        rt.close()
