"""The CLI's output contract as scripts meet it: output into a pipe wraps nowhere (help, archive, an archived
Run), every time in a JSON document is ISO 8601 in UTC, `run --json` and `runs show --json` print the same
document for the same Run, `skills list --json` carries each skill's schemas, `--help` says who a command
acts as, and a `--db` before the command is the database of the command after it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from harness.adapters.sql.store import SqlStore
from harness.cli import app
from harness.clock import FakeClock
from harness.drive.state_machine import StateMachine
from harness.retention.policy import DAY_S
from tests.integration.bulk_runs import drive

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?\+00:00$")
TIME_KEY = re.compile(r"^(at|timestamp)$|_at$")


def piped(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`harness ARGS` in a process of its own, its stdout a pipe (not a terminal)."""
    return subprocess.run([sys.executable, "-m", "harness.cli", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120, check=False)


def cli(*args: str, env: dict[str, str] | None = None) -> Result:
    """`harness ARGS` in-process, its output captured."""
    return CliRunner().invoke(app, list(args), env=env)


def times_of(doc: Any) -> list[tuple[str, Any]]:
    """Every (key, value) in the document whose key names a time, however deep."""
    if isinstance(doc, dict):
        return [(k, v) for k, v in doc.items() if TIME_KEY.search(k) and v is not None] + \
            [t for v in doc.values() for t in times_of(v)]
    if isinstance(doc, list):
        return [t for v in doc for t in times_of(v)]
    return []


def assert_iso_times(doc: Any) -> None:
    """Every time in `doc` is ISO 8601 in UTC, and there is at least one."""
    found = times_of(doc)
    assert found, "no time in the document"
    wrong = [(k, v) for k, v in found if not (isinstance(v, str) and ISO_UTC.match(v))]
    assert not wrong, f"times not ISO 8601 UTC: {wrong[:5]}"


@pytest.fixture
def archived(tmp_path: Path) -> tuple[str, str, Path]:
    """(db, run id, folder): a Run closed 40 days ago, in a folder whose paths are longer than 80 columns."""
    folder = tmp_path / ("a-folder-with-a-long-name-" * 3)
    folder.mkdir()
    db = str(folder / "h.db")
    store = SqlStore.open(db, FakeClock(start=time.time() - 40 * DAY_S))
    machine = StateMachine(store)
    run_id = drive(machine)
    store.drain_all()
    store.close()
    return db, run_id, folder


def test_help_into_a_pipe_wraps_nowhere(tmp_path: Path) -> None:
    """`--help` into a pipe keeps each sentence and each path on one line, and draws no boxes."""
    top = piped("--help", cwd=tmp_path)
    assert top.returncode == 0, top.stderr
    assert "replace their personal data in their Runs' live and archived records by a salted hash" in top.stdout
    assert "╭" not in top.stdout
    show = piped("runs", "show", "--help", cwd=tmp_path)
    assert "Checkpoint directory (default ./harness-checkpoints/<database id>)." in show.stdout


def test_archive_and_an_archived_run_into_a_pipe_keep_paths_whole(archived: tuple[str, str, Path]) -> None:
    """`harness archive` and `runs show` of the archived Run print the segment's path on one line."""
    db, run_id, folder = archived
    done = piped("archive", "--db", db, "--older-than-days", "0", cwd=folder)
    assert done.returncode == 0, done.stderr
    segment = next((folder / "harness-archive").glob("segment-*.jsonl.gz"))
    assert len(f"file://{segment}") > 80
    assert f"file://{segment}" in done.stdout, done.stdout
    shown = piped("runs", "show", run_id, "--db", db, cwd=folder)
    assert shown.returncode == 0, shown.stderr
    assert f"file://{segment}" in shown.stdout, shown.stdout


def test_an_archived_run_in_json_gives_iso_times(archived: tuple[str, str, Path]) -> None:
    """`runs show --json` of an archived Run (where it is, and read back) writes every time as ISO 8601."""
    db, run_id, folder = archived
    cps = str(folder / "cps")
    assert cli("archive", "--db", db, "--older-than-days", "0", "--to", str(folder / "arch"),
               "--checkpoint-dir", cps).exit_code == 0
    shown = cli("runs", "show", run_id, "--db", db, "--json")
    assert shown.exit_code == 0, shown.output
    assert_iso_times(json.loads(shown.stdout))
    back = cli("runs", "show", run_id, "--db", db, "--json", "--from-archive", "--checkpoint-dir", cps)
    assert back.exit_code == 0, back.output
    assert_iso_times(json.loads(back.stdout))


def test_trace_and_checkpoint_json_give_iso_times(tmp_path: Path) -> None:
    """`trace --json` (each record's time) and `audit checkpoint --json` (the tree head's time) are ISO."""
    db = str(tmp_path / "h.db")
    env = {"HARNESS_DATA_DIR": str(tmp_path / "data"), "HARNESS_MEMORY": "off"}
    run = cli("run", "Where is order A-1001?", "--db", db, "--json", env=env)
    assert run.exit_code == 0, run.output
    traced = cli("trace", json.loads(run.stdout)["run_id"], "--db", db, "--json", env=env)
    assert_iso_times(json.loads(traced.stdout))
    published = cli("audit", "checkpoint", "--db", db, "--dir", str(tmp_path / "cps"), "--json", env=env)
    assert published.exit_code == 0, published.output
    assert_iso_times(json.loads(published.stdout))


@pytest.mark.parametrize("task", ["Where is order A-1001?", "Refund 180 EUR for order A-1003"])
def test_run_and_runs_show_print_one_document(tmp_path: Path, task: str) -> None:
    """For a Run that succeeded and one waiting for a support lead, `run --json` and `runs show --json`
    print the same document, times in ISO 8601."""
    db = str(tmp_path / "h.db")
    env = {"HARNESS_DATA_DIR": str(tmp_path / "data"), "HARNESS_MEMORY": "off"}
    ran = cli("run", task, "--db", db, "--json", env=env)
    assert ran.exit_code == 0, ran.output
    doc = json.loads(ran.stdout)
    shown = cli("runs", "show", doc["run_id"], "--db", db, "--json", env=env)
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout) == doc
    assert_iso_times(doc)
    assert {"answer", "approval_request_id", "legacy_status", "transitions", "cost", "path"} <= doc.keys()


def test_skills_list_json_carries_each_skills_schemas(tmp_path: Path) -> None:
    """Every skill in `skills list --json` names the arguments it takes and, where declared, its result."""
    listed = cli("skills", "list", "--db", str(tmp_path / "h.db"), "--json")
    assert listed.exit_code == 0, listed.output
    skills = {s["id"]: s for s in json.loads(listed.stdout)["skills"]}
    assert all(s["input_schema"]["type"] == "object" for s in skills.values())
    assert skills["orders.lookup"]["input_schema"]["required"] == ["order_id"]
    assert "output_schema" in skills["orders.lookup"]


def test_help_and_readme_name_the_default_identity(tmp_path: Path) -> None:
    """`harness --help` and the README say whom a command acts as when it names nobody."""
    top = piped("--help", cwd=tmp_path)
    assert "acts as default/alice" in top.stdout
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert "acts as default/alice" in " ".join(readme.split())


def test_db_before_the_command_is_its_database(tmp_path: Path) -> None:
    """`harness --db FILE runs show ID` (the guide's form) reads FILE, as `runs show ID --db FILE` does."""
    db = str(tmp_path / "h.db")
    env = {"HARNESS_DATA_DIR": str(tmp_path / "data"), "HARNESS_MEMORY": "off"}
    ran = cli("run", "Hi, what can you do?", "--db", db, "--json", env=env)
    run_id = json.loads(ran.stdout)["run_id"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shown = piped("--db", db, "runs", "show", run_id, "--json", cwd=elsewhere, env={"HARNESS_DATABASE_URL": ""})
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["run_id"] == run_id
    assert not (elsewhere / "harness.db").exists()


def test_the_api_gives_an_archived_runs_times_in_iso(archived: tuple[str, str, Path],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The 410 body of an archived Run names when it was created, closed and archived in ISO 8601, UTC."""
    from fastapi.testclient import TestClient

    from harness.config import build_runtime
    from harness.service.app import create_app
    from harness.service.settings import ServiceSettings
    from harness.settings import Settings

    db, run_id, folder = archived
    monkeypatch.chdir(folder)
    assert cli("archive", "--db", db, "--older-than-days", "0").exit_code == 0
    runtime = build_runtime(Settings(db=db, data_dir=folder / "data"))
    try:
        with TestClient(create_app(runtime, ServiceSettings(session_secret="test-secret-test-secret"))) as client:
            gone = client.get(f"/api/v1/runs/{run_id}", headers={"Authorization": "Bearer demo-zoe-key"})
    finally:
        runtime.close()
    assert gone.status_code == 410, gone.text
    archived_doc = gone.json()["archived"]
    assert all(re.match(r"^\d{4}-\d\d-\d\dT[\d:.]+(Z|\+00:00)$", archived_doc[k])
               for k in ("created_at", "closed_at", "archived_at")), archived_doc
