"""The library, the CLI and the HTTP API are three faces of one path: the same task asked through each gives
the same Run, record for record, in its hash-chained trace (a behaviour fixed in one face is fixed in all)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from harness import Harness
from harness.cli import app as cli_app
from tests.acceptance.api_helpers import ORDER_STATUS, key, make_client, make_runtime

#: what a record says that does not depend on which face asked, when, or under which ids
STABLE = ("from", "to", "event", "skill_id", "status", "decision", "level", "passed", "purpose", "provider",
          "model", "call_kind", "idempotent", "arguments_hash", "result_hash", "final_state", "close_reason",
          "input_tokens", "output_tokens", "usd", "scope")


def signature(records: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, tuple[tuple[str, Any], ...]]]:
    return [(kind, tuple((k, data[k]) for k in STABLE if k in data)) for kind, data in records]


def through_the_library(folder: Path) -> list[tuple[str, dict[str, Any]]]:
    with Harness(db=str(folder / "h.db"), data_dir=folder / "data") as h:
        result = h.run(ORDER_STATUS, user="alice")
        assert result.state == "SUCCEEDED", result
        return [(e.kind, e.data) for e in h.trace(result.run_id)]


def through_the_cli(folder: Path) -> list[tuple[str, dict[str, Any]]]:
    db = str(folder / "h.db")
    ran = CliRunner().invoke(cli_app, ["run", ORDER_STATUS, "--db", db, "--json"])
    assert ran.exit_code == 0, ran.output
    run = json.loads(ran.stdout)
    assert run["state"] == "SUCCEEDED", run
    traced = CliRunner().invoke(cli_app, ["trace", run["run_id"], "--db", db, "--json"])
    assert traced.exit_code == 0, traced.output
    return [(r["kind"], {k: v for k, v in r.items() if k not in ("seq", "kind", "hash")})
            for r in json.loads(traced.stdout)["records"]]


def through_http(folder: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, dict[str, Any]]]:
    runtime = make_runtime(folder, monkeypatch)
    try:
        with make_client(runtime) as client:
            answer = client.post("/api/v1/runs", json={"task": ORDER_STATUS}, headers=key("alice"))
            assert answer.status_code in (200, 201, 202), answer.text
            run_id = answer.json()["run_id"]
            deadline = time.monotonic() + 30
            while (state := client.get(f"/api/v1/runs/{run_id}", headers=key("alice")).json()["state"]) not in (
                    "SUCCEEDED", "CLOSED_FAILED", "CLOSED_REJECTED", "CLOSED_CANCELLED"):
                assert time.monotonic() < deadline, state
                time.sleep(0.05)
            assert state == "SUCCEEDED"
            runtime.store.drain_all()
            doc = client.get(f"/api/v1/runs/{run_id}/trace", headers=key("alice")).json()
            return [(r["kind"], r["data"]) for r in doc["records"]]
    finally:
        runtime.close()


def test_the_library_the_cli_and_http_give_the_same_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One task, asked as alice of the bundled support example through `Harness.run`, `harness run` and
    POST /api/v1/runs, each on a database of its own: the three traces hold the same records in the same
    order, the same transitions, policy verdicts, model calls, tool calls (their arguments' and results'
    hashes) and close."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    faces = {}
    for name in ("library", "cli", "http"):
        (tmp_path / name).mkdir()
    faces["library"] = signature(through_the_library(tmp_path / "library"))
    faces["cli"] = signature(through_the_cli(tmp_path / "cli"))
    faces["http"] = signature(through_http(tmp_path / "http", monkeypatch))
    kinds = [kind for kind, _ in faces["library"]]
    assert {"transition", "policy", "llm", "tool", "run"} <= set(kinds), kinds
    assert any(dict(fields).get("result_hash") for kind, fields in faces["library"] if kind == "tool")
    assert faces["cli"] == faces["library"]
    assert faces["http"] == faces["library"]
