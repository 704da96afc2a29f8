"""Bounded input (SPEC U1, U2): every field of a Run request and the request as a whole have limits,
answered over HTTP with a 413 (the body) or a 422 naming the field, and on the CLI with exit 2; a request
over a limit creates nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from harness.adapters.sql import schema as t
from harness.config import Runtime, build_runtime
from harness.domain.limits import RequestLimits
from harness.settings import Settings
from tests.acceptance.api_helpers import (  # noqa: F401 - fixtures
    ORDER_STATUS,
    client_fixture,
    key,
    make_client,
    make_runtime,
    runtime_fixture,
)

MB = 1024 * 1024


def rows(runtime: Runtime) -> dict[str, int]:
    """How many rows the tables a created Run writes to hold."""
    with runtime.store.engine.connect() as conn:
        return {table.name: int(conn.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())
                for table in (t.runs, t.transitions, t.audit_events, t.outbox, t.jobs)}


def post(client: TestClient, body: Any, **kwargs: Any) -> tuple[int, dict[str, Any]]:
    response = client.post("/api/v1/runs", content=json.dumps(body), headers={
        **key("alice"), "Content-Type": "application/json"}, **kwargs)
    return response.status_code, response.json()


def test_a_10_mb_metadata_value_is_413_and_nothing_is_stored(client: TestClient, runtime: Runtime) -> None:
    """A body over the request limit is refused with 413 before it is read into a Run; the database
    neither gains a Run nor grows."""
    size = Path(runtime.settings.db or "").stat().st_size
    status, doc = post(client, {"task": ORDER_STATUS, "metadata": {"blob": "x" * (10 * MB)}})
    assert status == 413 and doc["error"] == "request_too_large"
    assert "1048576" in doc["detail"] and "HARNESS_MAX_REQUEST_BYTES" in doc["detail"]
    status, doc = post(client, {"task": ORDER_STATUS, "history": [{"role": "user", "content": "y" * 100_000}] * 200})
    assert status == 413
    assert set(rows(runtime).values()) == {0}
    assert Path(runtime.settings.db or "").stat().st_size < size + MB


def test_a_chunked_body_without_a_length_is_cut_off_at_the_limit(client: TestClient, runtime: Runtime) -> None:
    """A client that streams a body without Content-Length cannot get more than the limit read."""
    sent = []

    def chunks() -> Iterator[bytes]:
        yield b'{"task": "Where is order A-1001?", "metadata": {"blob": "'
        for _ in range(40):
            sent.append(1)
            yield b"z" * 65_536
        yield b'"}}'

    response = client.post("/api/v1/runs", content=chunks(), headers={
        **key("alice"), "Content-Type": "application/json"})
    assert response.status_code == 413 and response.json()["error"] == "request_too_large"
    assert rows(runtime)["runs"] == 0


FIELD_OVER: list[tuple[str, dict[str, Any], str]] = [
    ("task", {"task": "t" * 20_001}, "task: 20001 characters; the limit is 20000 (HARNESS_MAX_TASK_CHARS)"),
    ("history", {"history": [{"role": "user", "content": "hi"}] * 201}, "history: 201 messages"),
    ("message", {"history": [{"role": "user", "content": "m" * 100_001}]}, "history.0.content: 100001 characters"),
    ("metadata_value", {"metadata": {"note": "v" * 2_001}}, "metadata.note: 2001 characters"),
    ("metadata_entries", {"metadata": {f"k{i}": "v" for i in range(51)}}, "metadata: 51 entries"),
    ("metadata_key", {"metadata": {"k" * 129: "v"}}, "metadata"),
]


@pytest.mark.parametrize(("name", "extra", "message"), FIELD_OVER, ids=[f[0] for f in FIELD_OVER])
def test_a_field_over_its_limit_is_a_422_naming_it(client: TestClient, runtime: Runtime, name: str,
                                                   extra: dict[str, Any], message: str) -> None:
    """Each field's limit is answered with 422 and a message naming the field, and creates nothing."""
    status, doc = post(client, {"task": ORDER_STATUS, **extra})
    assert status == 422 and doc["error"] == "invalid_request", doc
    assert message in doc["detail"]
    assert set(rows(runtime).values()) == {0}


def test_limits_are_settings_read_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """HARNESS_MAX_* variables set the limits; a lowered limit is enforced over HTTP, a bad value is refused."""
    monkeypatch.setenv("HARNESS_MAX_TASK_CHARS", "12")
    monkeypatch.setenv("HARNESS_MAX_REQUEST_BYTES", "2048")
    limits = Settings.from_env().limits
    assert (limits.max_task_chars, limits.max_request_bytes) == (12, 2048)
    assert limits.max_metadata_entries == RequestLimits().max_metadata_entries
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    rt = build_runtime(Settings.from_env(db=str(tmp_path / "s.db"), data_dir=str(tmp_path / "data")))
    try:
        with make_client(rt) as client:
            status, doc = post(client, {"task": ORDER_STATUS})
            assert status == 422 and "task: 22 characters; the limit is 12" in doc["detail"]
            status, doc = post(client, {"task": "hi", "metadata": {"a": "b" * 3000}})
            assert status == 413 and "2048" in doc["detail"]
        assert set(rows(rt).values()) == {0}
    finally:
        rt.close()
    monkeypatch.setenv("HARNESS_MAX_TASK_CHARS", "lots")
    with pytest.raises(Exception, match="HARNESS_MAX_TASK_CHARS"):
        Settings.from_env()


def test_the_cli_answers_a_request_over_a_limit_with_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`harness run` with a task over its limit exits 2 naming the field on stderr, no traceback, no Run."""
    from harness.cli import app

    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("HARNESS_DATA_DIR", str(tmp_path / "data"))
    db = str(tmp_path / "cli.db")
    result = CliRunner().invoke(app, ["run", "t" * 20_001, "--db", db, "--json"])
    assert result.exit_code == 2, result.output
    assert "task: 20001 characters; the limit is 20000" in result.stderr
    assert "Traceback" not in result.output and result.stdout == ""
    rt = build_runtime(Settings(db=db, data_dir=tmp_path / "data"))
    try:
        assert rows(rt)["runs"] == 0
    finally:
        rt.close()


def test_the_library_refuses_a_request_over_its_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Embedded callers get the same limits: a 20 MB history is refused at submit and nothing is stored."""
    from harness.domain.errors import RequestTooLargeError

    rt = make_runtime(tmp_path, monkeypatch)
    try:
        history = [{"role": "user", "content": "h" * 100_000}] * 200
        with pytest.raises(RequestTooLargeError, match="limit is 1048576"):
            rt.runs.submit({"task": ORDER_STATUS, "user_id": "alice", "history": history})
        assert set(rows(rt).values()) == {0}
    finally:
        rt.close()


TOO_BIG = str(2**63)


def test_an_event_cursor_past_64_bits_is_a_422(client: TestClient) -> None:
    """`after` or Last-Event-ID of 2^63 is malformed input (422, JSON), never an overflow inside the stream;
    the largest 64-bit cursor still streams."""
    run_id = client.post("/api/v1/runs", json={"task": ORDER_STATUS}, headers=key("alice"),
                         params={"wait": "true"}).json()["run_id"]
    for path in ("/api/v1/events", f"/api/v1/runs/{run_id}/events"):
        response = client.get(path, headers=key("alice"), params={"after": TOO_BIG})
        assert response.status_code == 422 and response.json()["error"] == "invalid_request", response.text
        response = client.get(path, headers={**key("alice"), "Last-Event-ID": TOO_BIG})
        assert response.status_code == 422 and "Last-Event-ID" in response.json()["detail"]
    with client.stream("GET", f"/api/v1/runs/{run_id}/events", headers={
            **key("alice"), "Last-Event-ID": str(2**63 - 1)}) as stream:
        assert stream.status_code == 200
        assert "event: end" in "".join(stream.iter_text())


def test_a_list_cursor_that_is_not_a_number_is_a_422(client: TestClient) -> None:
    """`before` must be a finite time: inf and nan are 422s, not database errors."""
    for value in ("inf", "nan", "1e400"):
        response = client.get("/api/v1/runs", headers=key("alice"), params={"before": value})
        assert response.status_code == 422, (value, response.text)
