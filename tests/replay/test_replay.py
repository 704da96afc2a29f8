"""Replay of finished Runs from their recorded LLM answers and tool results (SPEC A5).

Each test makes a real Run on the test runtime, then replays it from the same database. A replay
must reproduce the path, plan, verdicts, tool calls and result; it must never call a skill or add a
Run to the source database; and an altered recording must be reported, naming what was altered.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pytest
import sqlalchemy as sa
import typer
from typer.testing import CliRunner

from harness.adapters.sql.blobs import BlobStore
from harness.cli.replay import replay as replay_command
from harness.cli.support import cli_errors
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.domain.contracts import CallerIdentity
from harness.domain.plans import Plan
from harness.domain.traces import TraceModel
from harness.pipeline.gatekeeper import Evaluation
from harness.replay.facts import ReplayReport
from harness.replay.runner import ReplayError, replay
from harness.settings import Settings
from tests.integration.conftest import (  # the real database servers, shared with the integration tests
    backend_url,
    pytest_generate_tests,
    servers,
)

__all__ = ["backend_url", "pytest_generate_tests", "servers"]  # fixtures and the backend parametrization

TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}
MAIN = ["CREATED", "PREPARING", "PLANNING", "POLICY_CHECK"]


def log_lines(log: Path) -> int:
    return len(log.read_text().splitlines())


def replayed(rt: Runtime, run_id: str, call_log: Path) -> ReplayReport:
    """Replay `run_id` and check the replay left the world alone: no skill call, no new source Run."""
    calls_before, runs_before = log_lines(call_log), len(rt.store.list_runs(limit=1000))
    report = replay(run_id, rt.store, rt.settings)
    assert log_lines(call_log) == calls_before, "a replay must never invoke a skill"
    assert len(rt.store.list_runs(limit=1000)) == runs_before, "a replay must not create Runs in the source"
    return report


def test_replay_of_a_success_has_no_divergence(test_runtime: Runtime, call_log: Path) -> None:
    """A successful multi-step Run replays to the same path, tool calls and answer."""
    result = test_runtime.runs.create_run({"task": "parallel", **TESS})
    assert result.state == "SUCCEEDED"
    report = replayed(test_runtime, result.run_id, call_log)
    assert report.ok, report.divergences
    assert report.summary["path"] == list(result.path) and report.summary["tool_calls"] == 3
    assert report.summary["llm_calls"] == 1 and report.summary["policy_verdicts"] > 0


def test_replay_of_a_policy_rejection_has_no_divergence(test_runtime: Runtime, call_log: Path) -> None:
    """A Run the guardrail rejected replays to the same verdicts and CLOSED_REJECTED, with no tool call."""
    result = test_runtime.runs.create_run({"task": "echo DROP TABLE users", **TESS})
    assert list(result.path) == [*MAIN, "REJECTED", "TRACING", "CLOSED_REJECTED"]
    report = replayed(test_runtime, result.run_id, call_log)
    assert report.ok, report.divergences
    assert report.summary["tool_calls"] == 0


class OneVerdictPolicyTrace(TraceModel):
    """A policy record as databases written before one PolicyTrace per evaluation hold it: one rule's verdict."""

    kind: Literal["policy"] = "policy"
    rule_id: str
    family: str
    decision: str
    reason: str
    step_id: str | None = None
    level: str | None = None
    duration_us: float = 0.0


@pytest.mark.parametrize("task", ["parallel", "echo DROP TABLE users"])
def test_a_recording_with_a_policy_record_per_verdict_replays(test_runtime: Runtime, call_log: Path,
                                                               monkeypatch: pytest.MonkeyPatch, task: str) -> None:
    """A Run recorded with the older policy records (one per verdict) replays to the same verdicts: the
    replay's single PolicyTrace is read against them without a divergence."""
    evaluate = test_runtime.policy.evaluate

    def one_record_per_verdict(plan: Plan, caller: CallerIdentity, run_id: str, **rules: Any) -> Evaluation:
        evaluation = evaluate(plan, caller, run_id, **rules)
        old = tuple(OneVerdictPolicyTrace(run_id=run_id, **v.model_dump()) for v in evaluation.decision.verdicts)
        return Evaluation(evaluation.decision, old)  # type: ignore[arg-type]  # only to_record() is used

    monkeypatch.setattr(test_runtime.policy, "evaluate", one_record_per_verdict)  # the source Run only
    result = test_runtime.runs.create_run({"task": task, **TESS})
    test_runtime.store.drain_all()
    policy = [r.data() for r in test_runtime.store.trace_of(result.run_id) if r.kind == "policy"]
    assert len(policy) > 1 and all("verdicts" not in p for p in policy)
    report = replayed(test_runtime, result.run_id, call_log)
    assert report.ok, report.divergences
    assert report.summary["policy_verdicts"] == len(policy)


@pytest.mark.parametrize("task", ["fail", "prose", "llm auth"])
def test_replay_of_a_failure_has_no_divergence(test_runtime: Runtime, call_log: Path, task: str) -> None:
    """A skill failure, an invalid plan and an LLM error each replay to the same failure."""
    result = test_runtime.runs.create_run({"task": task, **TESS})
    assert result.state == "CLOSED_FAILED"
    report = replayed(test_runtime, result.run_id, call_log)
    assert report.ok, report.divergences
    assert report.summary["state"] == "CLOSED_FAILED"


def test_replay_of_an_approved_run_resubmits_the_decision(test_runtime: Runtime, call_log: Path) -> None:
    """A Run that waited for a human replays with the recorded decision, by the same identity."""
    parked = test_runtime.runs.create_run({"task": "update T-7", **TESS})
    tess = CallerIdentity(tenant_id="t1", user_id="tess", roles=("tester",))
    _, result = test_runtime.runs.decide(parked.approval_request_id or "", tess, "approve")
    assert result.state == "SUCCEEDED" and "AWAITING_HITL" in result.path
    report = replayed(test_runtime, result.run_id, call_log)
    assert report.ok, report.divergences


def test_replay_of_an_approval_timeout(test_runtime: Runtime, clock: FakeClock, call_log: Path) -> None:
    """A Run whose approval timed out replays to the same default-deny close."""
    parked = test_runtime.runs.create_run({"task": "update T-8", **TESS})
    clock.advance(3_601)
    test_runtime.runs.expire_approvals()
    result = test_runtime.runs.result(parked.run_id)
    assert result.state == "CLOSED_REJECTED"
    report = replayed(test_runtime, result.run_id, call_log)
    assert report.ok, report.divergences


def tamper(rt: Runtime, digest: str, value: object) -> None:
    """Rewrite one blob the way an attacker with DDL rights would: drop the guard, update the row."""
    with rt.store.engine.begin() as conn:
        conn.exec_driver_sql("DROP TRIGGER blobs_no_update")
        conn.execute(sa.text("UPDATE blobs SET content = :c WHERE hash = :h"),
                     {"c": json.dumps(value, separators=(",", ":"), sort_keys=True), "h": digest})


def test_a_tampered_tool_result_is_reported_as_divergence(test_runtime: Runtime, call_log: Path) -> None:
    """Editing a recorded tool result is named as the first divergence, and its consequences show."""
    result = test_runtime.runs.create_run({"task": "echo hello", **TESS})
    test_runtime.store.drain_all()
    tool = next(r.data() for r in test_runtime.store.trace_of(result.run_id) if r.kind == "tool")
    stored = BlobStore(test_runtime.store.engine).raw([tool["result_hash"]])
    assert json.loads(stored[tool["result_hash"]]) == {"text": "hello"}
    tamper(test_runtime, tool["result_hash"], {"text": "goodbye"})
    report = replayed(test_runtime, result.run_id, call_log)
    assert not report.ok
    first = report.divergences[0]
    assert (first.check, first.where) == ("recording", "tool result of step a") and "altered" in first.detail
    assert {d.check for d in report.divergences} >= {"tool_call", "result"}


def test_blobs_cannot_be_updated_in_place(test_runtime: Runtime) -> None:
    """The blob table is append-only like the trace: an UPDATE is refused by the database."""
    test_runtime.runs.create_run({"task": "echo hi", **TESS})
    with pytest.raises(sa.exc.DBAPIError, match="append-only"), test_runtime.store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE blobs SET content = 'null'"))


def test_a_changed_policy_shows_as_divergence(test_runtime: Runtime, call_log: Path, tmp_path: Path) -> None:
    """Replaying under a policy that now forbids the call diverges at the policy verdicts."""
    result = test_runtime.runs.create_run({"task": "echo hello", **TESS})
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    stricter = tmp_path / "policy.yaml"
    policy = (fixtures / "policy.yaml").read_text().replace('value: "DROP TABLE"', 'value: "hello"')
    stricter.write_text(policy.replace("policies.cedar", str(fixtures / "policies.cedar")))
    settings = test_runtime.settings.model_copy(update={"policy_file": stricter})
    report = replay(result.run_id, test_runtime.store, settings)
    assert not report.ok and report.divergences[0].check == "policy"


def test_only_finished_runs_can_be_replayed(test_runtime: Runtime) -> None:
    """A Run still waiting for a human is refused with a reason, not half-replayed."""
    parked = test_runtime.runs.create_run({"task": "update T-9", **TESS})
    with pytest.raises(ReplayError, match="only a finished Run"):
        replay(parked.run_id, test_runtime.store, test_runtime.settings)


def cli() -> typer.Typer:
    app = typer.Typer()
    app.command()(cli_errors(replay_command))
    return app


def cli_settings(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> Settings:
    """Point the command line's environment at the runtime's skills, policy, rules and identities."""
    settings = rt.settings
    for key, value in (("HARNESS_SKILLS_DIRS", str(settings.skills_dirs[0])),
                       ("HARNESS_POLICY_FILE", str(settings.policy_file)),
                       ("HARNESS_LLM_RULES", str(settings.llm_rules)),
                       ("HARNESS_IDENTITIES", str(settings.identities_file))):
        monkeypatch.setenv(key, value)
    return settings


def test_cli_exit_codes_follow_u1(test_runtime: Runtime, call_log: Path,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`harness replay` exits 0 with no divergence, 1 on divergence, 2 for an unknown Run; --json prints
    one document naming the first divergence."""
    db = cli_settings(test_runtime, monkeypatch).db or ""
    good = test_runtime.runs.create_run({"task": "echo hi", **TESS})
    bad = test_runtime.runs.create_run({"task": "echo there", **TESS})
    test_runtime.store.drain_all()
    tool = next(r.data() for r in test_runtime.store.trace_of(bad.run_id) if r.kind == "tool")
    tamper(test_runtime, tool["result_hash"], {"text": "elsewhere"})
    runner = CliRunner()
    ok = runner.invoke(cli(), [good.run_id, "--db", db, "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["divergent"] is False
    diverged = runner.invoke(cli(), [bad.run_id, "--db", db, "--json"])
    assert diverged.exit_code == 1
    assert json.loads(diverged.stdout)["first_divergence"]["check"] == "recording"
    unknown = runner.invoke(cli(), ["no-such-run", "--db", db])
    assert unknown.exit_code == 2 and "no run with id" in unknown.stderr
    missing = runner.invoke(cli(), [good.run_id, "--db", str(Path(db).parent / "absent.db")])
    assert missing.exit_code == 2 and not (Path(db).parent / "absent.db").exists()


def test_recording_and_replay_on_every_backend(backend_url: str, tmp_path: Path, call_log: Path) -> None:
    """On SQLite, PostgreSQL and MariaDB the blobs are written with their records (equal contents once,
    no conflict) and refuse UPDATE, and a Run recorded there — one that recalled an earlier Run's
    memory — replays without divergence."""
    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    settings = Settings(db=backend_url, skills_dirs=(fixtures / "skills",),
                        policy_file=fixtures / "policy.yaml",
                        llm_rules=fixtures / "llm_rules.yaml", identities_file=fixtures / "identities.yaml",
                        data_dir=tmp_path / "data")
    rt = build_runtime(settings)
    try:
        first = rt.runs.create_run({"task": "echo same", **TESS})
        second = rt.runs.create_run({"task": "echo same", **TESS})  # same arguments and result: shared blobs
        assert first.state == second.state == "SUCCEEDED"
        assert rt.runs.assembled_context(second.run_id).memory, "recall of the first Run"
        rt.store.drain_all()
        tool = next(r.data() for r in rt.store.trace_of(second.run_id) if r.kind == "tool")
        stored = BlobStore(rt.store.engine).raw([tool["arguments_hash"], tool["result_hash"]])
        assert all(BlobStore.verified(h, text) for h, text in stored.items()) and len(stored) == 1
        with pytest.raises(sa.exc.DBAPIError, match="append-only"), rt.store.engine.begin() as conn:
            conn.execute(sa.text("UPDATE blobs SET content = 'null'"))
        report = replayed(rt, second.run_id, call_log)
        assert report.ok, report.divergences
    finally:
        rt.close()
