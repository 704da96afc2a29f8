"""Admission control as callers meet it (SPEC S1 / K5 amendment, U1, U2): with the queue of Runs waiting to
start at its bound, the HTTP API answers 429 with Retry-After and a JSON error naming the backlog and the
bound, `harness run` exits 1 with one line saying when to retry, `Harness.create` raises BacklogFullError;
none of them writes anything. A start deadline is a field of the create body and of `harness run`."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from harness import BacklogFullError, Harness
from harness.adapters.sql import schema as t
from harness.adapters.sql.store import SqlStore
from harness.cli import app
from harness.clock import FakeClock
from harness.config import build_runtime
from harness.domain.records import NewRun
from harness.settings import Settings

from .api_helpers import key, make_client


def fill(db: str, n: int, clock: FakeClock | None = None) -> None:
    """`n` accepted Runs waiting to start, written straight into the database."""
    store = SqlStore.open(db, clock or FakeClock())
    try:
        for i in range(n):
            store.create_run(NewRun("default", "alice", "s", {"task": f"queued {i}"}))
    finally:
        store.close()


def runs_in(db: str) -> int:
    store = SqlStore.open(db, FakeClock())
    try:
        with store.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(t.runs)).scalar_one())
    finally:
        store.close()


def test_http_answers_429_with_retry_after_and_creates_nothing(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """POST /api/v1/runs over the bound: 429 `backlog_full`, Retry-After, the backlog and the bound in the
    body; the Runs already queued are untouched and no Run is added."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    clock = FakeClock()  # stands still: the worker's re-drive grace never passes, so the queue stays full
    db = str(tmp_path / "service.db")
    fill(db, 4, clock)
    runtime = build_runtime(Settings(db=db, data_dir=tmp_path / "data", max_backlog=4, backlog_retry_after_s=9),
                            clock=clock)
    try:
        with make_client(runtime) as client:
            response = client.post("/api/v1/runs", json={"task": "Where is order A-1001?"}, headers=key("alice"))
            assert response.status_code == 429, response.text
            assert response.headers["Retry-After"] == "9"
            body = response.json()
            assert body["error"] == "backlog_full" and (body["backlog"], body["bound"]) == (4, 4)
            assert body["retry_after_s"] == 9 and "HARNESS_MAX_BACKLOG" in body["detail"]
            late = client.post("/api/v1/runs", headers=key("alice"),
                               json={"task": "Where is order A-1001?", "start_by": "2001-01-01T00:00:00Z"})
            assert late.status_code == 422 and "start_by" in late.text
    finally:
        runtime.close()
    assert runs_in(db) == 4


def test_http_takes_a_start_by_with_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The create body's start_by is stored with the Run's request, in UTC."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    runtime = build_runtime(Settings(db=str(tmp_path / "service.db"), data_dir=tmp_path / "data"))
    start_by = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).replace(microsecond=0)
    try:
        with make_client(runtime) as client:
            east = start_by.astimezone(dt.timezone(dt.timedelta(hours=2))).isoformat()  # any offset, kept in UTC
            response = client.post("/api/v1/runs", headers=key("alice"), params={"wait": "true"},
                                   json={"task": "Where is order A-1001?", "start_by": east})
            assert response.status_code == 202, response.text
            stored = runtime.store.get_run(response.json()["run_id"])
            assert stored.request["start_by"] == start_by.isoformat().replace("+00:00", "Z")
            assert stored.state.value == "SUCCEEDED"
    finally:
        runtime.close()


def test_cli_run_exits_1_naming_the_bound_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`harness run` over the bound: exit 1, one line on stderr naming the bound and when to retry, no
    traceback, no Run written; `--start-by` and `--start-within` together are bad usage (exit 2)."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    db = str(tmp_path / "cli.db")
    fill(db, 2)
    env = {"HARNESS_MAX_BACKLOG": "2", "HARNESS_DATA_DIR": str(tmp_path / "data")}
    result = CliRunner().invoke(app, ["run", "Where is order A-1001?", "--db", db, "--json"], env=env)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "at most 2 (HARNESS_MAX_BACKLOG)" in lines[0] and "retry after 5 s" in lines[0]
    assert "Traceback" not in result.output and result.stdout == ""
    assert runs_in(db) == 2
    both = CliRunner().invoke(app, ["run", "x", "--db", db, "--start-by", "2030-01-01T00:00:00Z",
                                    "--start-within", "5"], env=env)
    assert both.exit_code == 2 and "not both" in both.stderr


def test_cli_run_with_a_start_deadline_runs_in_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`harness run --start-within 60` starts at once, well within its deadline, and succeeds."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    db = str(tmp_path / "cli.db")
    result = CliRunner().invoke(app, ["run", "Where is order A-1001?", "--db", db, "--start-within", "60", "--json"],
                                env={"HARNESS_DATA_DIR": str(tmp_path / "data")})
    assert result.exit_code == 0, result.output
    assert '"state": "SUCCEEDED"' in result.stdout


def test_harness_create_raises_backlog_full(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Python API refuses with BacklogFullError (a HarnessError) carrying the retry-after."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    db = str(tmp_path / "api.db")
    fill(db, 1)
    with Harness(db=db, data_dir=tmp_path / "data", max_backlog=1) as h:
        with pytest.raises(BacklogFullError) as refused:
            h.create("Where is order A-1001?", user="alice")
        assert refused.value.retry_after_s == 5 and refused.value.bound == 1
    assert runs_in(db) == 1
