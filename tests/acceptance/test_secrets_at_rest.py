"""A secret in a Run request never rests in clear (SPEC C4, amended): the filter runs at submit, so the
stored request, the Run documents and lists, the trace, the blobs, the memory written back, the logs and
every byte of the database files hold only the filtered text."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import yaml

from harness.adapters.sql import schema as t
from harness.context.prose_secrets import normalise
from tests.acceptance.api_helpers import key, make_client, make_runtime

CORPUS = yaml.safe_load((Path(__file__).resolve().parents[1] / "fixtures" / "secret_canaries.yaml")
                        .read_text(encoding="utf-8"))["secrets"]
#: secrets long and distinctive enough that finding one anywhere can only mean it leaked
CANARIES = [c for c in CORPUS if len(c["secret"]) >= 8 and not c["secret"].isdigit()]
PLANTED = "\n".join(c["text"] for c in CANARIES)


def leaks(haystack: str) -> list[str]:
    """The canaries found in `haystack`, read plainly or normalised as the filter reads."""
    seen = normalise(haystack)[0]
    return [c["name"] for c in CANARIES if c["secret"] in haystack or normalise(c["secret"])[0] in seen]


def database_text(engine: sa.Engine) -> str:
    """Every value of every table, as text."""
    parts: list[str] = []
    with engine.connect() as conn:
        for table in t.metadata.sorted_tables:
            for row in conn.execute(sa.select(table)):
                parts.extend(str(v) for v in row)
    return "\n".join(parts)


def files_text(root: Path) -> str:
    """Every file under `root` (the database with its write-ahead log, ledger, data, checkpoints)."""
    return "\n".join(p.read_bytes().decode("utf-8", "replace") for p in sorted(root.rglob("*")) if p.is_file())


def test_a_secret_planted_in_every_field_is_nowhere_at_rest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """Canaries in the task, the history, the metadata and the memory query of a Run created over HTTP
    are found in none of: the responses, runs.request, any table (trace, blobs, memory, audit), any file
    of the database or the data folder, the logs; the Run still succeeds on the filtered request."""
    caplog.set_level(logging.DEBUG)
    runtime = make_runtime(tmp_path, monkeypatch)
    body: dict[str, Any] = {
        "task": f"Where is order A-1001? {PLANTED}",
        "history": [{"role": "user", "content": PLANTED}, {"role": "assistant", "content": PLANTED},
                    {"role": "tool", "content": PLANTED}],
        "metadata": {f"m{i}": c["text"] for i, c in enumerate(CANARIES[:50])},
    }
    try:
        with make_client(runtime) as client:
            created = client.post("/api/v1/runs", json=body, headers=key("alice"), params={"wait": "true"})
            assert created.status_code == 202, created.text
            run = created.json()
            assert run["state"] == "SUCCEEDED", run["error"]
            assert "[REDACTED:" in run["task"]
            seen = [created.text]
            for path in (f"/api/v1/runs/{run['run_id']}", "/api/v1/runs", f"/api/v1/runs/{run['run_id']}/trace",
                         f"/jobs/{run['run_id']}"):
                response = client.get(path, headers=key("alice"))
                assert response.status_code == 200, response.text
                seen.append(response.text)
            assert leaks("\n".join(seen)) == []
        stored = runtime.store.get_run(run["run_id"]).request
        assert leaks(str(stored)) == [] and "[REDACTED:" in stored["history"][0]["content"]
        assert all("[REDACTED:" in v for v in stored["metadata"].values())
        runtime.store.drain_all()
        assert leaks(database_text(runtime.store.engine)) == []
        assert leaks("\n".join(r.getMessage() + str(r.__dict__) for r in caplog.records)) == []
    finally:
        runtime.close()
    assert leaks(files_text(tmp_path)) == []


def test_memory_query_and_embedded_submit_are_filtered_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A library caller's request (memory query included) is stored filtered, and written-back memory
    holds no canary."""
    runtime = make_runtime(tmp_path, monkeypatch)
    try:
        result = runtime.runs.create_run({"task": f"Where is order A-1001? {PLANTED}", "user_id": "alice",
                                          "memory": {"query": CANARIES[0]["text"]}})
        assert result.state == "SUCCEEDED", result.error
        stored = runtime.store.get_run(result.run_id).request
        assert leaks(str(stored)) == [] and "[REDACTED:" in stored["memory"]["query"]
        with runtime.store.engine.connect() as conn:
            memory = conn.execute(sa.select(t.memory_entries.c.content)).scalars().all()
        assert memory and leaks("\n".join(memory)) == []
    finally:
        runtime.close()
