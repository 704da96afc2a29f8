"""`harness audit …` as an operator drives it: one JSON document with --json, exit codes 0 / 1 / 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from harness.adapters.sql.store import SqlStore
from harness.audit import standalone
from harness.cli import app
from harness.domain.records import NewRun
from harness.drive.state_machine import StateMachine
from harness.kernel.states import RunState

S = RunState


def audit(*args: str) -> Result:
    """Run `harness audit ARGS` in-process."""
    return CliRunner().invoke(app, ["audit", *args])


def doc(result: Result) -> Any:
    """The single JSON document the command printed on stdout."""
    return json.loads(result.stdout)


@pytest.fixture
def db(db_path: Path, store: SqlStore, machine: StateMachine) -> str:
    """A database with one succeeded and one failed Run, as a --db argument."""
    for path in ((S.PREPARING, S.PLANNING, S.POLICY_CHECK, S.EXECUTING, S.TRACING), (S.PREPARING, S.FAILED)):
        run, _ = store.create_run(NewRun("acme", "ana", "s1", {"task": "t"}))
        state = S.CREATED
        for target in path:
            machine.transition(run.run_id, state, target, actor="test", reason="go")
            state = target
    store.drain_all()
    return str(db_path)


def tamper(store: SqlStore) -> None:
    """Edit one trace record with the append-only trigger out of the way."""
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER trace_records_no_update")
        conn.exec_driver_sql("UPDATE trace_records SET payload = payload || ' ' WHERE seq = 3")


def test_verify_and_reconcile_pass_on_a_clean_database(db: str) -> None:
    """A clean database verifies and reconciles with exit 0 and one JSON document each."""
    for command in ("verify", "reconcile"):
        result = audit(command, "--db", db, "--json")
        assert result.exit_code == 0, result.output
        assert doc(result)["ok"] is True


def test_verify_exits_1_and_names_the_first_bad_record(db: str, store: SqlStore) -> None:
    """A tampered record makes verify exit 1 with the record named, in JSON and in text."""
    tamper(store)
    result = audit("verify", "--db", db, "--json")
    assert result.exit_code == 1
    assert doc(result)["first_bad"]["seq"] == 3 and doc(result)["first_bad"]["kind"] == "edited"
    text = audit("verify", "--db", db)
    assert text.exit_code == 1 and "first bad" in text.stdout and "edited" in text.stdout


def test_reconcile_exits_1_on_a_mismatch(db: str, store: SqlStore) -> None:
    """A Run state changed behind the kernel's back makes reconcile exit 1 and list the Run."""
    with store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE runs SET state = 'CLOSED_CANCELLED' WHERE state = 'CLOSED_FAILED'")
    result = audit("reconcile", "--db", db, "--json")
    assert result.exit_code == 1
    assert doc(result)["ok"] is False and doc(result)["mismatches"]
    assert audit("reconcile", "--db", db).exit_code == 1


def test_checkpoint_export_and_standalone_verification(db: str, store: SqlStore, tmp_path: Path) -> None:
    """The documented flow: checkpoint, export a Run to a file, verify it with harness-verify."""
    cpdir, out = tmp_path / "cps", tmp_path / "run.json"
    published = audit("checkpoint", "--db", db, "--dir", str(cpdir), "--json")
    assert published.exit_code == 0, published.output
    assert doc(published)["tree_size"] == store.chain_head()[0]
    run_id = store.list_runs()[0].run_id
    exported = audit("export", run_id, "--db", db, "--dir", str(cpdir), "-o", str(out), "--json")
    assert exported.exit_code == 0, exported.output
    assert doc(exported)["complete"] is True
    assert standalone.main(["export", str(out), "--checkpoint", doc(published)["path"]]) == 0
    to_stdout = audit("export", run_id, "--db", db, "--dir", str(cpdir))
    assert doc(to_stdout)["run_id"] == run_id
    assert audit("verify", "--db", db, "--checkpoint-dir", str(cpdir), "--json").exit_code == 0


def test_export_warns_when_records_are_newer_than_the_checkpoint(
    db: str, store: SqlStore, machine: StateMachine, tmp_path: Path
) -> None:
    """Records chained after the newest checkpoint are reported on stderr, not silently dropped."""
    cpdir = tmp_path / "cps"
    run, _ = store.create_run(NewRun("acme", "ana", "s1", {"task": "late"}))
    assert audit("checkpoint", "--db", db, "--dir", str(cpdir)).exit_code == 0
    machine.transition(run.run_id, S.CREATED, S.PREPARING, actor="test", reason="go")
    result = audit("export", run.run_id, "--db", db, "--dir", str(cpdir))
    assert result.exit_code == 0 and "newer than" in result.stderr
    assert doc(result)["complete"] is False


def test_drain_chains_the_outbox(db: str, store: SqlStore) -> None:
    """`audit drain` moves waiting outbox records into the chain and reports the new head."""
    store.create_run(NewRun("acme", "ana", "s1", {"task": "t"}))
    result = audit("drain", "--db", db, "--json")
    assert result.exit_code == 0
    assert doc(result)["chained"] == 2 and doc(result)["outbox_backlog"] == 0


@pytest.mark.parametrize("args", [
    ("verify", "--db", "/no/such/folder/h.db"),
    ("reconcile", "--db", "{tmp}/missing.db"),
    ("verify", "--db", "{tmp}/garbage.db"),
    ("verify", "--db", "{db}", "--checkpoint-dir", "{tmp}/nowhere"),
    ("export", "no-such-run", "--db", "{db}", "--dir", "{tmp}/cps"),
    ("export", "whatever", "--db", "{db}", "--dir", "{tmp}/empty"),
    ("checkpoint", "--db", "{db}", "--dir", "{tmp}/garbage.db"),
])
def test_bad_input_exits_2_without_a_traceback(db: str, tmp_path: Path, args: tuple[str, ...]) -> None:
    """Bad paths, unknown Runs and missing checkpoints exit 2 with the reason on stderr."""
    (tmp_path / "garbage.db").write_text("this is not a database")
    (tmp_path / "empty").mkdir()
    assert audit("checkpoint", "--db", db, "--dir", str(tmp_path / "cps")).exit_code == 0
    result = audit(*(a.format(tmp=tmp_path, db=db) for a in args))
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: ") and "Traceback" not in result.output
    assert result.stdout == ""


def test_checkpoint_refuses_a_rewritten_history_with_exit_1(db: str, store: SqlStore, tmp_path: Path) -> None:
    """Publishing over a chain that no longer matches the last checkpoint is a failed check."""
    cpdir = str(tmp_path / "cps")
    assert audit("checkpoint", "--db", db, "--dir", cpdir).exit_code == 0
    tamper(store)
    result = audit("checkpoint", "--db", db, "--dir", cpdir)
    assert result.exit_code == 1 and "tampered history" in result.stderr


def test_export_of_a_run_that_has_not_closed_warns(db: str, store: SqlStore, machine: StateMachine,
                                                   tmp_path: Path) -> None:
    """A Run still in flight has no RunTrace: its export says it cannot prove completeness, and
    harness-verify refuses it unless --allow-incomplete."""
    cpdir, out = tmp_path / "cps", tmp_path / "run.json"
    run, _ = store.create_run(NewRun("acme", "ana", "s1", {"task": "open"}))
    machine.transition(run.run_id, S.CREATED, S.PREPARING, actor="test", reason="go")
    published = audit("checkpoint", "--db", db, "--dir", str(cpdir), "--json")
    result = audit("export", run.run_id, "--db", db, "--dir", str(cpdir), "-o", str(out))
    assert result.exit_code == 0 and "has not closed" in result.stderr
    checkpoint = doc(published)["path"]
    assert standalone.main(["export", str(out), "--checkpoint", checkpoint]) == 1
    assert standalone.main(["export", str(out), "--checkpoint", checkpoint, "--allow-incomplete"]) == 0
