"""`harness archive` and the reads of an archived Run, as an operator drives them: --json, exit codes
0 / 1 / 2, no traceback; the API says where an archived Run is."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from harness.adapters.sql.store import SqlStore
from harness.cli import app
from harness.clock import FakeClock
from harness.domain.records import NewRun
from harness.kernel import RunState
from harness.retention.policy import DAY_S
from harness.state_machine import StateMachine

S = RunState
SUCCESS = (S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TRACING)


def cli(*args: str, env: dict[str, str] | None = None) -> Result:
    """Run `harness ARGS` in-process."""
    return CliRunner().invoke(app, list(args), env=env)


def doc(result: Result) -> Any:
    """The JSON document the command printed."""
    return json.loads(result.stdout)


@pytest.fixture
def old_runs(tmp_path: Path) -> tuple[str, list[str], Path]:
    """(db, run ids, working folder): three Runs last changed 40 days ago, the third of tenant `beta`."""
    clock = FakeClock(start=time.time() - 40 * DAY_S)
    db = str(tmp_path / "h.db")
    store = SqlStore.open(db, clock)
    machine = StateMachine(store)
    ids = []
    for tenant in ("acme", "acme", "beta"):
        run, _ = store.create_run(NewRun(tenant, "ana", "s1", {"task": "t"}))
        state = S.CREATED
        for target in SUCCESS:
            machine.transition(run.run_id, state, target, actor="test", reason="go")
            state = target
        ids.append(run.run_id)
    store.drain_all()
    store.close()
    return db, ids, tmp_path


def _args(db: str, tmp: Path) -> list[str]:
    return ["--db", db, "--to", str(tmp / "archive"), "--checkpoint-dir", str(tmp / "cp")]


def test_archive_prunes_and_runs_show_says_where(old_runs: tuple[str, list[str], Path]) -> None:
    """archive --json reports the segment; runs show of an archived Run says archived and where, exit 0;
    --from-archive reads its path back after checking the segment; audit verify passes."""
    db, ids, tmp = old_runs
    dry = cli("archive", *_args(db, tmp), "--older-than-days", "0", "--dry-run", "--json")
    assert dry.exit_code == 0 and sorted(doc(dry)["due"]) == sorted(ids)
    done = cli("archive", *_args(db, tmp), "--older-than-days", "0", "--json",
               env={"HARNESS_RETENTION_TENANTS": "beta=never"})
    assert done.exit_code == 0, done.output
    report = doc(done)
    assert report["runs"] == report["pruned_runs"] == 2 and report["location"].startswith("file://")
    shown = cli("runs", "show", ids[0], "--db", db, "--json")
    assert shown.exit_code == 0, shown.output
    assert doc(shown)["archived"]["location"] == report["location"] and doc(shown)["state"] == "SUCCEEDED"
    back = cli("runs", "show", ids[0], "--db", db, "--json", "--from-archive", "--checkpoint-dir", str(tmp / "cp"))
    assert back.exit_code == 0, back.output
    assert doc(back)["verified"] is True and doc(back)["path"][-1] == "SUCCEEDED"
    human = cli("runs", "show", ids[0], "--db", db)
    assert "ARCHIVED" in human.stdout and report["location"] in human.stdout.replace("\n", "")
    assert doc(cli("runs", "show", ids[2], "--db", db, "--json"))["state"] == "SUCCEEDED"  # beta: kept
    verify = cli("audit", "verify", "--db", db, "--checkpoint-dir", str(tmp / "cp"), "--json")
    assert verify.exit_code == 0 and doc(verify)["records_pruned"] > 0


def test_a_tampered_segment_is_refused_on_read_back(old_runs: tuple[str, list[str], Path]) -> None:
    """--from-archive of a Run whose segment was altered exits 1 naming the problem."""
    db, ids, tmp = old_runs
    report = doc(cli("archive", *_args(db, tmp), "--older-than-days", "0", "--json"))
    path = Path(report["location"].removeprefix("file://"))
    path.chmod(0o644)
    path.write_bytes(path.read_bytes()[:-40])
    back = cli("runs", "show", ids[0], "--db", db, "--from-archive", "--checkpoint-dir", str(tmp / "cp"))
    assert back.exit_code == 1 and "does not verify" in back.output


def test_bad_retention_settings_are_bad_input(old_runs: tuple[str, list[str], Path]) -> None:
    """No retention period, a malformed one, or a bad archive URL: exit 2 naming it, no traceback."""
    db, _, tmp = old_runs
    for env, named in (({}, "no retention period"), ({"HARNESS_RETENTION_DAYS": "soon"}, "HARNESS_RETENTION_DAYS"),
                       ({"HARNESS_RETENTION_DAYS": "1", "HARNESS_RETENTION_TENANTS": "acme"}, "tenant=days")):
        done = cli("archive", *_args(db, tmp), env=env)
        assert done.exit_code == 2 and named in done.output and "Traceback" not in done.output
    bad = cli("archive", "--db", db, "--to", "ftp://x/y", "--older-than-days", "1")
    assert bad.exit_code == 2 and "archive URL" in bad.output


def test_the_api_says_a_run_is_archived(old_runs: tuple[str, list[str], Path],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """GET /api/v1/runs/ID of an archived Run of the caller's tenant answers 410 with where it is; another
    tenant still gets 404."""
    from harness.config import Settings, build_runtime
    from tests.acceptance.api_helpers import key, make_client

    db, ids, tmp = old_runs
    assert cli("archive", *_args(db, tmp), "--older-than-days", "0").exit_code == 0
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp / "ledger.jsonl"))
    runtime = build_runtime(Settings(db=db, data_dir=tmp / "data"))
    try:
        with make_client(runtime) as client:
            answer = client.get(f"/api/v1/runs/{ids[0]}", headers=key("zoe"))
            assert answer.status_code == 410, answer.text
            assert answer.json()["error"] == "archived"
            assert answer.json()["archived"]["location"].startswith("file://")
            assert client.get(f"/api/v1/runs/{ids[0]}", headers=key("alice")).status_code == 404
    finally:
        runtime.close()
