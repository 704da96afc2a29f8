"""Roles come from the identity directory only (SPEC G4): an unknown identity has none, a request that
names none gets its identity's, and the CLI's --role can narrow the directory's roles, never add one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.config import Runtime, build_runtime
from harness.settings import Settings
from tests.acceptance.api_helpers import ORDER_STATUS, REFUND_L3


def test_a_request_without_roles_gets_the_directorys_and_an_unknown_identity_none(support_runtime: Runtime) -> None:
    """No role is assumed by default: alice gets support_agent from the directory, an unknown user gets
    no roles (and the permission rule refuses it), roles a library caller names are kept."""
    known = support_runtime.runs.create_run({"task": ORDER_STATUS, "user_id": "alice"})
    assert known.state == "SUCCEEDED", known.error
    assert support_runtime.store.get_run(known.run_id).request["roles"] == ["support_agent"]
    stranger = support_runtime.runs.create_run({"task": ORDER_STATUS, "user_id": "zed"})
    assert support_runtime.store.get_run(stranger.run_id).request["roles"] == []
    assert stranger.state == "CLOSED_REJECTED" and "roles: none" in (stranger.error or ""), stranger.error
    named = support_runtime.runs.submit({"task": ORDER_STATUS, "user_id": "zed", "roles": ["support_agent"]})[0]
    assert named.request["roles"] == ["support_agent"]


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The support example on a database in the test folder; returns the database path."""
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(tmp_path / "ledger.jsonl"))
    monkeypatch.setenv("HARNESS_DATA_DIR", str(tmp_path / "data"))
    return str(tmp_path / "cli.db")


def stored_roles(db: str, run_id: str) -> list[str]:
    rt = build_runtime(Settings(db=db))
    try:
        roles: list[str] = rt.store.get_run(run_id).request["roles"]
        return roles
    finally:
        rt.close()


def test_the_cli_takes_roles_from_the_directory_and_only_narrows_them(cli_env: str) -> None:
    """`--role support_lead` as alice (who is not a lead) exits 2 and creates nothing; carol narrowed to
    support_agent runs with only that role; an unknown --user runs with no roles, and is told so."""
    runner = CliRunner()
    claimed = runner.invoke(app, ["run", REFUND_L3, "--user", "alice", "--role", "support_lead", "--db", cli_env])
    assert claimed.exit_code == 2 and "--role support_lead: default/alice does not hold it" in claimed.stderr
    narrowed = runner.invoke(app, ["run", ORDER_STATUS, "--user", "carol", "--role", "support_agent",
                                   "--db", cli_env, "--json"])
    assert narrowed.exit_code == 0, narrowed.output
    doc = json.loads(narrowed.stdout)
    assert doc["state"] == "SUCCEEDED" and stored_roles(cli_env, doc["run_id"]) == ["support_agent"]
    stranger = runner.invoke(app, ["run", ORDER_STATUS, "--user", "zed", "--db", cli_env, "--json"])
    assert stranger.exit_code == 0, stranger.output
    assert "default/zed is not in the identity directory, so it has no roles" in stranger.stderr
    doc = json.loads(stranger.stdout)
    assert doc["state"] == "CLOSED_REJECTED" and stored_roles(cli_env, doc["run_id"]) == []
    rt = build_runtime(Settings(db=cli_env))
    try:
        assert len(rt.store.list_runs()) == 2  # the refused claim created nothing
    finally:
        rt.close()


def test_the_cli_cancels_as_the_api_does_only_for_the_requester_or_an_operator(cli_env: str) -> None:
    """`harness cancel --as bob` on alice's Run is refused (exit 1) and changes nothing, as bob's key is over
    HTTP; alice cancels her own Run, and an operator anyone's of the tenant."""
    runner = CliRunner()

    def parked() -> str:
        made = runner.invoke(app, ["run", REFUND_L3, "--user", "alice", "--db", cli_env, "--json"])
        assert made.exit_code == 0, made.output
        doc = json.loads(made.stdout)
        assert doc["state"] == "AWAITING_HITL"
        return str(doc["run_id"])

    mine, theirs = parked(), parked()
    refused = runner.invoke(app, ["cancel", mine, "--as", "bob", "--db", cli_env, "--json"])
    assert refused.exit_code == 1 and refused.stdout == ""
    assert "only the Run's requester or an operator may cancel it" in refused.stderr
    rt = build_runtime(Settings(db=cli_env))
    try:
        assert rt.store.get_run(mine).state.value == "AWAITING_HITL"  # nothing changed
    finally:
        rt.close()
    for run_id, who in ((mine, "alice"), (theirs, "operator")):
        done = runner.invoke(app, ["cancel", run_id, "--as", who, "--db", cli_env, "--json"])
        assert done.exit_code == 0, done.output
        assert json.loads(done.stdout)["state"] == "CLOSED_CANCELLED"
