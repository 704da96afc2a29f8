"""The rows people read are proven against the chain: with the append-only triggers dropped, an edit of a
transition, an audit event, an approval request or decision, a cost, a Run's state, owner or result, or
its legacy job is named by `harness audit verify` — table, row and field — on SQLite, PostgreSQL and
MariaDB, and the command exits 1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.audit.verify import verify_chain
from harness.cli import app
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.domain.contracts import CallerIdentity
from harness.settings import Settings

from ..conftest import FIXTURES

TESTER = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}


def drop_append_only(conn: sa.Connection, table: str) -> None:
    """Remove a table's UPDATE/DELETE guard, as an attacker with the database's credentials could."""
    dialect = conn.dialect.name
    if dialect == "postgresql":
        conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_no_change ON {table}")
        return
    for verb in ("update", "delete"):
        conn.exec_driver_sql(f"DROP TRIGGER IF EXISTS {table}_no_{verb}")


def edit(rt: Runtime, sql: str, **params: Any) -> None:
    """Run one UPDATE with every append-only trigger out of the way."""
    with rt.store.engine.begin() as conn:
        for table in ("transitions", "audit_events", "costs", "hitl_decisions"):
            drop_append_only(conn, table)
        assert conn.execute(sa.text(sql), params).rowcount >= 1, sql


@pytest.fixture
def world(backend_url: str, tmp_path: Path, call_log: Path) -> Iterator[tuple[Runtime, dict[str, str]]]:
    """Succeeded Runs, an approved one (request and decision), a cancelled one awaiting approval and a
    failed one, every record chained."""
    settings = Settings(db=backend_url, skills_dirs=(FIXTURES / "skills",), policy_file=FIXTURES / "policy.yaml",
                        llm_rules=FIXTURES / "llm_rules.yaml", identities_file=FIXTURES / "identities.yaml",
                        data_dir=tmp_path / "data", memory="off")
    rt = build_runtime(settings, clock=FakeClock())
    runs = {name: rt.runs.create_run({"task": task, **TESTER}).run_id
            for name, task in (("a", "echo a"), ("b", "echo b"), ("c", "echo c"), ("failed", "fail"))}
    parked = rt.runs.create_run({"task": "update T-1", **TESTER})
    approver = CallerIdentity(tenant_id="t1", user_id="tess", roles=("tester",))
    _verdict, done = rt.runs.decide(str(parked.approval_request_id), approver, "approve", reason="fine")
    assert done.state == "SUCCEEDED"
    runs["approved"], runs["request"] = parked.run_id, str(parked.approval_request_id)
    cancelled = rt.runs.create_run({"task": "update T-2", **TESTER})
    rt.runs.cancel(cancelled.run_id, by="t1/tess")
    runs["cancelled"] = cancelled.run_id
    rt.store.drain_all()
    try:
        yield rt, runs
    finally:
        rt.close()


#: (table, field, the UPDATE an attacker runs, the run it touches)
EDITS = [
    ("transitions", "actor", "UPDATE transitions SET actor = 'mallory' WHERE run_id = :r AND seq = 1", "a"),
    ("transitions", "reason", "UPDATE transitions SET reason = 'as agreed' WHERE run_id = :r AND seq = 2", "b"),
    ("audit_events", "detail", "UPDATE audit_events SET detail = '{\"forged\": true}' "
                               "WHERE run_id = :r AND event = 'run_succeeded'", "a"),
    ("hitl_decisions", "approver", "UPDATE hitl_decisions SET approver = 't1/lee' WHERE run_id = :r", "approved"),
    ("hitl_requests", "requester", "UPDATE hitl_requests SET requester = 'lee' WHERE run_id = :r", "approved"),
    ("hitl_requests", "status", "UPDATE hitl_requests SET status = 'pending' WHERE run_id = :r", "cancelled"),
    ("costs", "usd", "UPDATE costs SET usd = 0.0001 WHERE run_id = :r", "b"),
    ("costs", "input_tokens", "UPDATE costs SET input_tokens = 1 WHERE run_id = :r", "c"),
    ("runs", "state", "UPDATE runs SET state = 'CLOSED_FAILED' WHERE run_id = :r", "c"),
    ("runs", "result", "UPDATE runs SET result = '{\"answer\": \"refunded\"}' WHERE run_id = :r", "approved"),
    ("runs", "tenant_id", "UPDATE runs SET tenant_id = 't2' WHERE run_id = :r", "failed"),
    ("jobs", "status", "UPDATE jobs SET status = 'done' WHERE job_id = :r", "failed"),
]


def named(report: Any) -> set[tuple[str | None, str | None, str | None]]:
    """(table, field, run) of every problem."""
    return {(p.table, p.field, p.run_id) for p in report.problems}


def test_every_kind_of_row_edit_is_named_by_table_row_and_field(world: tuple[Runtime, dict[str, str]]) -> None:
    """A clean database verifies; after each kind of edit, verify names the edited table, row and field
    (and the CLI exits 1 with them in its JSON)."""
    rt, runs = world
    clean = verify_chain(SqlAuditReads(rt.store))
    assert clean.ok, clean.problems
    assert clean.rows_checked > 40 and not clean.warnings[1:]
    for _table, _field, sql, run in EDITS:
        edit(rt, sql, r=runs[run])
    report = verify_chain(SqlAuditReads(rt.store), limit=200)
    assert not report.ok
    found = named(report)
    for table, field, _sql, run in EDITS:
        assert (table, field, runs[run]) in found, (table, field, sorted(map(str, found)))
    by_field = {(p.table, p.field): p for p in report.problems}
    decision = by_field[("hitl_decisions", "approver")]
    assert decision.row is not None and decision.row.startswith("decision ") and decision.seq is not None
    assert "t1/lee" in decision.detail and "t1/tess" in decision.detail
    assert by_field[("transitions", "actor")].row == f"run {runs['a']} seq 1"
    cli = CliRunner().invoke(app, ["audit", "verify", "--db", rt.settings.db or "", "--json", "--limit", "200"])
    assert cli.exit_code == 1, cli.output
    doc = json.loads(cli.stdout)
    assert {(p["table"], p["field"]) for p in doc["problems"]} >= {(e[0], e[1]) for e in EDITS}


def test_deleted_rows_and_rows_of_no_run_are_named(world: tuple[Runtime, dict[str, str]]) -> None:
    """A deleted audit event or decision leaves its chained record without a row; a deleted Run leaves
    records (and rows) of no Run: each is named."""
    rt, runs = world
    with rt.store.engine.begin() as conn:
        for table in ("audit_events", "hitl_decisions"):
            drop_append_only(conn, table)
        conn.execute(sa.text("DELETE FROM audit_events WHERE run_id = :r AND event = 'run_succeeded'"),
                     {"r": runs["a"]})
        conn.execute(sa.text("DELETE FROM hitl_decisions WHERE run_id = :r"), {"r": runs["approved"]})
        conn.execute(sa.text("DELETE FROM runs WHERE run_id = :r"), {"r": runs["failed"]})
    report = verify_chain(SqlAuditReads(rt.store), limit=200)
    kinds = {(p.kind, p.table, p.run_id) for p in report.problems}
    assert ("record_without_row", "audit_events", runs["a"]) in kinds
    assert ("record_without_row", "hitl_decisions", runs["approved"]) in kinds
    assert ("run_row_missing", "runs", runs["failed"]) in kinds
    assert ("row_of_no_run", "transitions", runs["failed"]) in kinds
