"""`harness archive` and the reads of an archived Run, as an operator drives them: --json, exit codes
0 / 1 / 2, no traceback; the API says where an archived Run is, or reads it back checked."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from harness.adapters.sql.store import SqlStore
from harness.cli import app
from harness.clock import FakeClock
from harness.domain.records import NewRun
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState
from harness.retention.policy import DAY_S

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
    from harness.config import build_runtime
    from harness.settings import Settings
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


def _rewrite_segment(location: str, edit: Callable[[list[dict[str, Any]]], None]) -> None:
    """Apply `edit` to the segment's decoded lines and write it back in place (as someone with write
    access to the archive could)."""
    path = Path(location.removeprefix("file://"))
    lines = [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().splitlines()]
    edit(lines)
    path.chmod(0o644)
    path.write_bytes(gzip.compress("".join(json.dumps(line) + "\n" for line in lines).encode(), mtime=0))


def test_the_api_reads_an_archived_run_back_checked(old_runs: tuple[str, list[str], Path],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """GET /api/v1/runs/ID?from_archive=true answers the archived Run as its segment holds it, after checking
    the segment: the same path the live Run had; without the flag still 410; an unknown id, another tenant's
    Run or a never-archived id 404; a live Run answers as usual; the OpenAPI documents both bodies."""
    from harness.config import build_runtime
    from harness.settings import Settings
    from tests.acceptance.api_helpers import key, make_client

    db, ids, tmp = old_runs
    report = doc(cli("archive", *_args(db, tmp), "--older-than-days", "0", "--limit", "1", "--json"))
    assert report["pruned_runs"] == 1  # the oldest: ids[0]; ids[1], of the same tenant, stays live
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp / "ledger.jsonl"))
    runtime = build_runtime(Settings(db=db, data_dir=tmp / "data", checkpoint_dir=tmp / "cp"))
    try:
        with make_client(runtime) as client:
            back = client.get(f"/api/v1/runs/{ids[0]}", params={"from_archive": "true"}, headers=key("zoe"))
            assert back.status_code == 200, back.text
            body = back.json()
            assert body["verified"] is True and body["run_id"] == ids[0] and body["state"] == "SUCCEEDED"
            assert body["path"] == ["CREATED", *[s.value for s in SUCCESS], "SUCCEEDED"]
            assert [t["to_state"] for t in body["transitions"]] == body["path"] and body["records"] > 5
            assert body["archived"]["location"] == report["location"] and body["user_id"] == "ana"
            assert client.get(f"/api/v1/runs/{ids[0]}", headers=key("zoe")).status_code == 410
            for run_id, who in ((ids[0], "alice"), ("no-such-run", "zoe")):
                missing = client.get(f"/api/v1/runs/{run_id}", params={"from_archive": "true"}, headers=key(who))
                assert missing.status_code == 404 and missing.json()["error"] == "not_found", missing.text
            live = client.get(f"/api/v1/runs/{ids[1]}", params={"from_archive": "true"}, headers=key("zoe"))
            assert live.status_code == 200 and "verified" not in live.json() and live.json()["cost"] is not None
            spec = client.get("/openapi.json").json()
            answers = spec["paths"]["/api/v1/runs/{run_id}"]["get"]["responses"]
            shapes = json.dumps(answers["200"]) + json.dumps(answers["410"])
            assert "ArchivedRunDoc" in shapes and "RunDoc" in shapes and "ArchivedErrorDoc" in shapes
            assert {"409", "503"} <= set(answers)
    finally:
        runtime.close()


@pytest.mark.parametrize("tamper", ["truncated", "record_edited", "row_edited"])
def test_the_api_refuses_a_tampered_segment_on_read_back(old_runs: tuple[str, list[str], Path], tamper: str,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """from_archive of a Run whose segment was cut, had a record edited, or had only a row edited (rows are
    not in the Merkle proof: they are checked against the proven records) answers 409 archive_unverified
    naming the problem, never the altered Run."""
    from harness.config import build_runtime
    from harness.settings import Settings
    from tests.acceptance.api_helpers import key, make_client

    db, ids, tmp = old_runs
    location = doc(cli("archive", *_args(db, tmp), "--older-than-days", "0", "--json"))["location"]

    def edit(lines: list[dict[str, Any]]) -> None:
        line = next(d for d in lines if d.get("run_id") == ids[0])
        if tamper == "record_edited":
            line["records"][2]["payload"] = line["records"][2]["payload"].replace("go", "gone")
        else:
            line["tables"]["transitions"][-1]["to_state"] = "FAILED"

    if tamper == "truncated":
        path = Path(location.removeprefix("file://"))
        path.chmod(0o644)
        path.write_bytes(path.read_bytes()[:-40])
    else:
        _rewrite_segment(location, edit)
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp / "ledger.jsonl"))
    runtime = build_runtime(Settings(db=db, data_dir=tmp / "data", checkpoint_dir=tmp / "cp"))
    try:
        with make_client(runtime) as client:
            back = client.get(f"/api/v1/runs/{ids[0]}", params={"from_archive": "true"}, headers=key("zoe"))
            assert back.status_code == 409, back.text
            body = back.json()
            assert body["error"] == "archive_unverified" and "does not verify" in body["detail"]
            assert body["archived"]["location"] == location and "path" not in body and "transitions" not in body
            if tamper == "row_edited":
                assert "rows differ from its proven records" in body["detail"] and "'FAILED'" in body["detail"]
    finally:
        runtime.close()


def test_erase_reports_the_space_it_overwrote(old_runs: tuple[str, list[str], Path]) -> None:
    """erase --json on SQLite says it ran VACUUM and truncated the WAL; --no-vacuum leaves out the VACUUM;
    both exit 0, and audit verify and reconcile still pass after the archive and the erasure."""
    db, _ids, tmp = old_runs
    assert cli("archive", *_args(db, tmp), "--older-than-days", "0", "--json").exit_code == 0
    erased = cli("erase", "--user", "ana", "--tenant", "acme", "--db", db, "--json")
    assert erased.exit_code == 0, erased.output
    report = doc(erased)
    assert report["archived_runs"] == 2 and report["space"] == ["VACUUM", "wal_checkpoint(TRUNCATE)"], report
    again = cli("erase", "--user", "ana", "--tenant", "beta", "--db", db, "--no-vacuum")
    assert again.exit_code == 0, again.output
    assert "freed space: wal_checkpoint(TRUNCATE)" in again.stdout and "VACUUM" not in again.stdout
    verify = cli("audit", "verify", "--db", db, "--checkpoint-dir", str(tmp / "cp"), "--json")
    assert verify.exit_code == 0, verify.output
    reconciled = cli("audit", "reconcile", "--db", db, "--json")
    assert reconciled.exit_code == 0, reconciled.output
