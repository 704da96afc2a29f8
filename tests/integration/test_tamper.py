"""`verify_chain` detects every kind of tampering done with raw SQL and names the first bad record."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

import pytest
import sqlalchemy as sa

from harness.adapters.sql import triggers
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.adapters.sql.schema import digest_bytes
from harness.adapters.sql.store import SqlStore
from harness.audit.checkpoint import publish_checkpoint
from harness.audit.verify import verify_chain
from harness.domain.audit import ChainReport
from harness.domain.chain import GENESIS_HASH, record_hash
from harness.domain.records import NewRun, StoredTraceRecord, TraceRecordIn
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState

S = RunState
APPEND_ONLY = ("transitions", "audit_events", "trace_records")
PATHS: dict[str, Sequence[RunState]] = {
    "succeeded": (S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TRACING),
    "rejected": (S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.REJECTED),
    "failed": (S.PREPARING, S.FAILED),
    "in_flight": (S.PREPARING, S.PLANNING),
}


def drive(machine: StateMachine, path: Sequence[RunState]) -> str:
    """Create a Run and move it along `path` (the machine funnels transient states to a final one)."""
    run, _ = cast(SqlStore, machine.store).create_run(NewRun("acme", "ana", "s1", {"task": "t"}))
    state = S.CREATED
    for target in path:
        machine.transition(run.run_id, state, target, actor="test", reason=f"to {target}")
        state = target
    return run.run_id


@pytest.fixture
def runs(machine: StateMachine, store: SqlStore) -> dict[str, str]:
    """A mix of closed and in-flight Runs, fully chained."""
    made = {name: drive(machine, path) for name, path in PATHS.items()}
    store.drain_all()
    return made


def raw(store: SqlStore, *statements: tuple[str, dict[str, Any]]) -> None:
    """Run SQL as an attacker with database access would: the append-only triggers and the trigger that
    keeps trace_records one linear chain dropped, then restored."""
    with store.engine.begin() as conn:
        for table in APPEND_ONLY:
            for verb in ("update", "delete"):
                conn.exec_driver_sql(f"DROP TRIGGER {table}_no_{verb}")
        for statement in triggers.drop_linear_chain_ddl("sqlite"):
            conn.exec_driver_sql(statement)
        for sql, params in statements:
            conn.execute(sa.text(sql), stored(params))
        for table in APPEND_ONLY:
            for verb in ("UPDATE", "DELETE"):
                conn.exec_driver_sql(f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
                                     f"BEGIN SELECT RAISE(ABORT, '{table} is append-only'); END")
        for statement in triggers.linear_chain_ddl("sqlite"):
            conn.exec_driver_sql(statement)


#: the parameter names the tests give a hash, which the database holds as 32 bytes
HASH_PARAMS = {"prev_hash", "hash", "h", "prev"}


def stored(params: dict[str, Any]) -> dict[str, Any]:
    """The statement's parameters with every hash in the form the chain's columns hold it."""
    return {k: digest_bytes(v) if k in HASH_PARAMS else v for k, v in params.items()}


def records(store: SqlStore) -> list[StoredTraceRecord]:
    """The whole chain."""
    return list(store.iter_trace())


def rebuild_chain(store: SqlStore, keep: Callable[[StoredTraceRecord], bool],
                  payload: Callable[[StoredTraceRecord], str] = lambda r: r.payload) -> None:
    """Rewrite the whole table with a recomputed chain and chain head: the chain alone then looks intact."""
    rows: list[dict[str, Any]] = []
    prev = GENESIS_HASH
    for r in (r for r in records(store) if keep(r)):
        seq, body = len(rows) + 1, payload(r)
        digest = record_hash(seq, r.record_id, r.run_id, r.kind, prev, body)
        rows.append({"seq": seq, "record_id": r.record_id, "run_id": r.run_id, "kind": r.kind,
                     "payload": body, "prev_hash": prev, "hash": digest})
        prev = digest
    insert = ("INSERT INTO trace_records (seq, record_id, run_id, kind, payload, prev_hash, hash) "
              "VALUES (:seq, :record_id, :run_id, :kind, :payload, :prev_hash, :hash)")
    raw(store, ("DELETE FROM trace_records", {}), *((insert, row) for row in rows),
        ("UPDATE chain_head SET seq = :seq, hash = :hash WHERE id = 1", {"seq": len(rows), "hash": prev}))


def first_bad(report: ChainReport) -> tuple[str, int | None, str | None]:
    """(kind, seq, record_id) of the first problem."""
    assert not report.ok and report.first_bad is not None, report
    return report.first_bad.kind, report.first_bad.seq, report.first_bad.record_id


def test_an_untouched_chain_verifies(store: SqlStore, runs: dict[str, str]) -> None:
    """A chain written only by the store verifies, with every record checked and nothing named."""
    report = verify_chain(SqlAuditReads(store))
    assert report.ok and report.first_bad is None
    assert report.records_checked == store.chain_head()[0] > 20
    assert json.loads(json.dumps(report.to_dict()))["ok"] is True


@pytest.mark.parametrize("table", APPEND_ONLY)
def test_triggers_refuse_update_and_delete(store: SqlStore, runs: dict[str, str], table: str) -> None:
    """The database itself refuses UPDATE and DELETE on the append-only tables (SPEC A2)."""
    for sql in (f"UPDATE {table} SET run_id = run_id", f"DELETE FROM {table}"):
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), store.engine.begin() as conn:
            conn.execute(sa.text(sql))


def test_an_edited_record_is_named(store: SqlStore, runs: dict[str, str]) -> None:
    """Changing one record's payload is reported as an edit of exactly that record."""
    victim = records(store)[9]
    body = victim.payload.replace("to", "TO")
    raw(store, ("UPDATE trace_records SET payload = :p WHERE seq = 10", {"p": body}))
    assert first_bad(verify_chain(SqlAuditReads(store))) == ("edited", 10, victim.record_id)


def test_a_hash_overwritten_with_text_that_is_no_digest_is_named(store: SqlStore, runs: dict[str, str]) -> None:
    """A link overwritten with arbitrary text (not a digest's bytes, as the column holds) is reported as an
    edit of that record; verify neither fails nor looks the text up as a digest."""
    victim = records(store)[9]
    raw(store, ("UPDATE trace_records SET prev_hash = :junk WHERE seq = 10", {"junk": "not a digest"}))
    assert first_bad(verify_chain(SqlAuditReads(store))) == ("edited", 10, victim.record_id)


def test_an_edited_and_rehashed_record_is_named(store: SqlStore, runs: dict[str, str]) -> None:
    """Recomputing an edited record's own hash only moves the break to its link; it is still named."""
    victim = records(store)[9]
    body = victim.payload.replace("to", "TO")
    digest = record_hash(10, victim.record_id, victim.run_id, victim.kind, victim.prev_hash, body)
    raw(store, ("UPDATE trace_records SET payload = :p, hash = :h WHERE seq = 10", {"p": body, "h": digest}))
    assert first_bad(verify_chain(SqlAuditReads(store))) == ("edited", 10, victim.record_id)


def test_a_rehashed_last_record_is_caught_by_the_chain_head(store: SqlStore, runs: dict[str, str]) -> None:
    """The newest record, edited and rehashed, still disagrees with the hash chain_head remembers."""
    last = records(store)[-1]
    body = last.payload + " "
    digest = record_hash(last.seq, last.record_id, last.run_id, last.kind, last.prev_hash, body)
    raw(store, ("UPDATE trace_records SET payload = :p, hash = :h WHERE seq = :s",
                {"p": body, "h": digest, "s": last.seq}))
    assert first_bad(verify_chain(SqlAuditReads(store))) == ("head_mismatch", last.seq, last.record_id)


def test_a_deleted_record_is_named(store: SqlStore, runs: dict[str, str]) -> None:
    """Deleting a record in the middle is reported at its seq."""
    raw(store, ("DELETE FROM trace_records WHERE seq = 7", {}))
    assert first_bad(verify_chain(SqlAuditReads(store)))[:2] == ("deleted", 7)


def test_a_deleted_tail_is_caught_by_the_chain_head(store: SqlStore, runs: dict[str, str]) -> None:
    """Deleting the newest records leaves a chain that links, but the chain head still names them."""
    head = store.chain_head()[0]
    raw(store, ("DELETE FROM trace_records WHERE seq > :s", {"s": head - 2}))
    assert first_bad(verify_chain(SqlAuditReads(store)))[:2] == ("deleted", head - 1)


def test_a_record_inserted_in_the_middle_is_named(store: SqlStore, runs: dict[str, str]) -> None:
    """Shifting later records up and slipping a forged, self-consistent record in is reported at it."""
    payload = '{"event":"hitl_approved"}'
    digest = record_hash(6, "forged", runs["failed"], "audit", "f" * 64, payload)
    forged = {"seq": 6, "record_id": "forged", "run_id": runs["failed"], "kind": "audit", "payload": payload,
              "prev_hash": "f" * 64, "hash": digest}
    raw(store,
        ("UPDATE trace_records SET seq = -(seq + 1) WHERE seq >= 6", {}),
        ("UPDATE trace_records SET seq = -seq WHERE seq < 0", {}),
        ("INSERT INTO trace_records VALUES (:seq, :record_id, :run_id, :kind, :payload, :prev_hash, :hash)",
         forged))
    assert first_bad(verify_chain(SqlAuditReads(store))) == ("inserted", 6, "forged")


def test_a_record_appended_behind_the_heads_back_is_named(store: SqlStore, runs: dict[str, str]) -> None:
    """A well-linked record appended without moving chain_head is reported as inserted."""
    seq, head = store.chain_head()
    payload = '{"event":"run_succeeded"}'
    row = {"seq": seq + 1, "rid": "forged", "run": runs["failed"], "p": payload, "prev": head,
           "h": record_hash(seq + 1, "forged", runs["failed"], "audit", head, payload)}
    raw(store, ("INSERT INTO trace_records VALUES (:seq, :rid, :run, 'audit', :p, :prev, :h)", row))
    assert first_bad(verify_chain(SqlAuditReads(store)))[:2] == ("inserted", seq + 1)


def test_reordered_records_are_named(store: SqlStore, runs: dict[str, str]) -> None:
    """Swapping two records' positions is reported as a reorder at the first of them."""
    moved = records(store)[11]
    raw(store,
        ("UPDATE trace_records SET seq = -1 WHERE seq = 12", {}),
        ("UPDATE trace_records SET seq = 12 WHERE seq = 13", {}),
        ("UPDATE trace_records SET seq = 13 WHERE seq = -1", {}))
    report = verify_chain(SqlAuditReads(store))
    assert first_bad(report)[:2] == ("reordered", 12)
    assert (report.problems[1].kind, report.problems[1].seq, report.problems[1].record_id) == (
        "reordered", 13, moved.record_id)


def test_deleting_a_whole_runs_records_is_detected(store: SqlStore, runs: dict[str, str]) -> None:
    """Removing every record of one Run leaves holes in the chain and a Run without its trace."""
    raw(store, ("DELETE FROM trace_records WHERE run_id = :r", {"r": runs["rejected"]}))
    report = verify_chain(SqlAuditReads(store))
    assert first_bad(report)[0] == "deleted"
    assert ("run_trace_missing", runs["rejected"]) in {(p.kind, p.run_id) for p in report.problems}


def test_deleting_a_run_and_relinking_the_chain_is_detected(store: SqlStore, runs: dict[str, str]) -> None:
    """Even with the chain and its head recomputed around the hole, the Run's missing trace is named."""
    rebuild_chain(store, keep=lambda r: r.run_id != runs["succeeded"])
    report = verify_chain(SqlAuditReads(store))
    assert [(p.kind, p.run_id) for p in report.problems] == [("run_trace_missing", runs["succeeded"])]


def test_a_transition_record_deleted_and_relinked_is_detected(store: SqlStore, runs: dict[str, str]) -> None:
    """A relinked chain missing one transition record no longer matches the transitions table."""
    gone = next(r for r in records(store) if r.kind == "transition" and r.run_id == runs["failed"])
    rebuild_chain(store, keep=lambda r: r.record_id != gone.record_id)
    report = verify_chain(SqlAuditReads(store))
    assert [(p.kind, p.run_id) for p in report.problems] == [("transition_record_missing", runs["failed"]),
                                                             ("run_record_missing", runs["failed"])]
    assert report.problems[0].table == "transitions" and report.problems[1].record_id == gone.record_id


def test_a_whole_table_rewrite_is_caught_by_an_earlier_checkpoint(
    store: SqlStore, runs: dict[str, str], tmp_path: Path
) -> None:
    """A rewrite with recomputed chain and head passes the chain walk but not the signed checkpoint."""
    directory = tmp_path / "checkpoints"
    publish_checkpoint(SqlAuditReads(store), directory)
    assert any("policy_rejected" in r.payload for r in records(store))
    rebuild_chain(store, keep=lambda r: True,
                  payload=lambda r: r.payload.replace("policy_rejected", "policy_approved"))
    raw(store, ("UPDATE audit_events SET event = 'policy_approved' WHERE event = 'policy_rejected'", {}))
    assert verify_chain(SqlAuditReads(store)).ok  # the chain alone, and the rows edited to match it, cannot tell
    report = verify_chain(SqlAuditReads(store), directory)
    assert first_bad(report)[0] == "checkpoint_mismatch"
    assert "checkpoint-00000001.json" in report.problems[0].detail


def test_records_waiting_in_the_outbox_are_reported_not_failed(store: SqlStore, runs: dict[str, str]) -> None:
    """An outbox backlog is reported, but is not a verification failure (SPEC A4)."""
    store.record([TraceRecordIn("step", {"n": 1}, runs["in_flight"])])
    report = verify_chain(SqlAuditReads(store))
    assert report.ok and report.outbox_backlog == 1


def test_problem_listing_is_capped_but_all_are_counted(store: SqlStore, runs: dict[str, str]) -> None:
    """Editing many records lists at most `limit` of them and counts them all."""
    raw(store, ("UPDATE trace_records SET payload = payload || ' ' WHERE seq <= 10", {}))
    report = verify_chain(SqlAuditReads(store), limit=3)
    assert len(report.problems) == 3 and report.problem_count == 10
    assert [p.seq for p in report.problems] == [1, 2, 3]
