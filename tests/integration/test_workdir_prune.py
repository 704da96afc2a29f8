"""Working directories of Runs closed by another process are pruned (the sweeper may close a Run on
another host, where this process's close listener never fires)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.config import Runtime, build_runtime
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState
from harness.settings import Settings

S = RunState
TESTER = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}


def test_prune_removes_only_the_directories_of_final_runs(test_runtime: Runtime) -> None:
    """A Run closed by another machine (no listener here) loses its directory on the next prune; a Run still
    going and a folder that is no Run's keep theirs."""
    closed, _ = test_runtime.runs.submit({"task": "echo a", **TESTER})
    going, _ = test_runtime.runs.submit({"task": "echo b", **TESTER})
    workdirs = test_runtime.runs.tools.workdirs
    for run_id in (closed.run_id, going.run_id, "not-a-run"):
        (workdirs.ensure(run_id) / "scratch.txt").write_text("x")
    elsewhere = StateMachine(test_runtime.store)  # another process's machine: this runtime's listeners miss it
    elsewhere.transition(closed.run_id, S.CREATED, S.FAILED, actor="sweeper", reason="stuck")
    assert test_runtime.store.get_run(closed.run_id).state == S.CLOSED_FAILED
    assert workdirs.path(closed.run_id).exists()

    assert test_runtime.runs.prune_workdirs() == [closed.run_id]
    assert not workdirs.path(closed.run_id).exists()
    assert workdirs.path(going.run_id).exists() and workdirs.path("not-a-run").exists()
    assert test_runtime.runs.prune_workdirs() == []


def test_harness_sweep_reports_the_directories_it_removed(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`harness sweep --json` prunes this host's directories of final Runs and lists them."""
    monkeypatch.chdir(tmp_path)  # the default data folder is relative to where harness runs
    db = str(tmp_path / "h.db")
    rt = build_runtime(Settings.from_env(db=db))
    try:
        run, _ = rt.runs.submit({"task": "Where is order A-1001?", "user_id": "alice"})
        rt.runs.tools.workdirs.ensure(run.run_id)
        StateMachine(rt.store).transition(run.run_id, S.CREATED, S.FAILED, actor="sweeper", reason="stuck")
        workdir = rt.runs.tools.workdirs.path(run.run_id)
    finally:
        rt.close()
    done = CliRunner().invoke(app, ["sweep", "--db", db, "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(done.output)["workdirs_removed"] == [run.run_id]
    assert not workdir.exists()
