"""A secret a skill returns never leaves the system raw: the tool's output passes the same secret filter
as a Run's input before it is stored (the RunContext, the blobs behind the trace's hashes, the Run's
result), returned (the API), pushed (the run.finished webhook, to a real receiver) or exported."""

from __future__ import annotations

import hashlib
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from fastapi.testclient import TestClient

from harness.adapters.sql import schema as t
from harness.adapters.sql.audit_reads import SqlAuditReads
from harness.audit.checkpoint import publish_checkpoint
from harness.audit.export import export_run
from harness.clock import FakeClock
from harness.config import Runtime, build_runtime
from harness.service.app import create_app
from harness.service.settings import ServiceSettings
from harness.settings import Settings
from tests.conftest import FIXTURES
from tests.fakes.webhook_receiver import WebhookReceiver

from .webhook_setup import write_config

#: what the skill returns: 16 kinds of secret, by field name and stated in prose (en, de, fr, es);
#: every value is made up and long enough that finding it anywhere can only mean it leaked
SECRETS: dict[str, str] = {
    "pin": "58203917",
    "passcode": "Q7X2K9M4",
    "security_answer": "Fluffy McWhiskers",
    "password": "Tr0ub4dor&3xq",
    "pin_de": "Ihre PIN lautet 40917362",
    "otp_de": "Ihr Einmalcode: 66120934",
    "otp_fr": "votre code à usage unique est 73029184",
    "answer_es": "la respuesta de seguridad es Calcetines Rojos",
    "passcode_es": "el código de acceso es 88123409",
    "otp_en": "your one-time code is 31415926",
    "api_key": "sk-proj-Z9yX8wV7uT6sR5qP4oN3mL2kJ1",
    "aws_key": "AKIAZ7Q2LEAKYOUTPUT9",
    "github": "ghp_LeakedFromAToolOutput0123456789abcd",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJsZWFrZWQtdG9vbCJ9.c2lnbmF0dXJlLWxlYWtlZA",
    "database_url": "postgresql://app:Pg0utputS3cret@db.internal:5432/app",
    "header": "Authorization: Bearer b3arerFromToolOutput77x",
}
#: the part of each that must not survive
CANARIES = ["58203917", "Q7X2K9M4", "Fluffy McWhiskers", "Tr0ub4dor&3xq", "40917362", "66120934", "73029184",
            "Calcetines Rojos", "88123409", "31415926", "Z9yX8wV7uT6sR5qP4oN3mL2kJ1", "AKIAZ7Q2LEAKYOUTPUT9",
            "LeakedFromAToolOutput0123456789abcd", "c2lnbmF0dXJlLWxlYWtlZA", "Pg0utputS3cret",
            "b3arerFromToolOutput77x"]
TESS = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}
API_KEY = "test-tess-key-for-the-output-filter"


def leaks(text: str) -> list[str]:
    """The canaries found in `text`."""
    return [c for c in CANARIES if c in text]


@pytest.fixture
def leaky(tmp_path: Path) -> tuple[Path, Path]:
    """(skills folder with test.leak, LLM rules that call it and answer with two of its fields)."""
    skills = tmp_path / "leaky_skills"
    skills.mkdir()
    (skills / "leaky.py").write_text(textwrap.dedent(f"""
        def leak(args, ctx):
            return {{"account": "C-77", "status": "active", "count": 3, "note": {SECRETS["pin_de"]!r},
                    "security_answer": {SECRETS["security_answer"]!r}, "secrets": {SECRETS!r}}}

        def leak_fail(args, ctx):
            raise RuntimeError("could not log in: " + {SECRETS["pin_de"]!r} + ", " + {SECRETS["github"]!r})
        """))
    (skills / "leak.yaml").write_text(yaml.safe_dump({
        "id": "test.leak", "version": "1.0.0", "entrypoint": "leaky.py:leak", "input_schema": {"type": "object"},
        "risk": {"access": "read", "space": "personal", "impact": "low"}, "timeout_s": 10, "idempotent": True}))
    (skills / "leak_fail.yaml").write_text(yaml.safe_dump({
        "id": "test.leak_fail", "version": "1.0.0", "entrypoint": "leaky.py:leak_fail",
        "input_schema": {"type": "object"}, "risk": {"access": "read", "space": "personal", "impact": "low"},
        "timeout_s": 10, "idempotent": True}))
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"rules": [{"name": "leak", "when": "^leak$", "plan": {
        "steps": [{"id": "a", "tool_call": {"skill": "test.leak", "arguments": {}}, "output_key": "a"}],
        "answer_template": "{a.account}: {a.note} / {a.security_answer}"}},
        {"name": "leak_fail", "when": "^leak and fail$", "plan": {"steps": [
            {"id": "a", "tool_call": {"skill": "test.leak_fail", "arguments": {}}, "output_key": "a"}]}}]}))
    return skills, rules


@pytest.fixture
def rt(backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, leaky: tuple[Path, Path],
       call_log: Path) -> Iterator[Runtime]:
    """A runtime with test.leak that pushes Run results to t1's callbacks."""
    skills, rules = leaky
    identities = tmp_path / "identities.yaml"
    identities.write_text(yaml.safe_dump({"identities": {"t1/tess": {
        "roles": ["tester"], "api_key_sha256": hashlib.sha256(API_KEY.encode()).hexdigest()}}}))
    settings = Settings(db=backend_url, skills_dirs=(FIXTURES / "skills", skills), policy_file=FIXTURES / "policy.yaml",
                        llm_rules=rules, identities_file=identities, data_dir=tmp_path / "data",
                        webhooks_file=write_config(tmp_path, monkeypatch))
    runtime = build_runtime(settings, clock=FakeClock())
    yield runtime
    runtime.close()


def database_text(engine: sa.Engine) -> str:
    """Every value of every table, as text."""
    with engine.connect() as conn:
        return "\n".join(str(v) for table in t.metadata.sorted_tables for row in conn.execute(sa.select(table))
                         for v in row)


def test_secrets_a_skill_returns_are_filtered_before_they_are_stored_returned_pushed_or_exported(
        rt: Runtime, tmp_path: Path) -> None:
    """Every secret of a skill's output is redacted in the Run's result, its RunContext, every table
    (blobs, trace, outbox), the API's answers, the webhook a real receiver got, and the Run's export;
    the output's plain fields are kept."""
    with WebhookReceiver(mode="ok") as receiver:
        result = rt.runs.create_run({"task": "leak", **TESS, "callback": f"http://127.0.0.1:{receiver.port}/h"})
        assert result.state == "SUCCEEDED", result.error
        dispatcher = rt.dispatcher()
        try:
            assert dispatcher.deliver_all().delivered
        finally:
            dispatcher.close()
        pushed = [g.body for g in receiver.got]
    output = result.artifacts["a"]
    assert output["account"] == "C-77" and output["status"] == "active" and output["count"] == 3
    assert output["secrets"]["pin"] == "[REDACTED:pin]"
    assert output["secrets"]["security_answer"] == "[REDACTED:security_answer]"
    assert result.answer == "C-77: Ihre PIN lautet [REDACTED:pin] / [REDACTED:security_answer]"
    stored = rt.store.get_run(result.run_id)
    assert leaks(str(result)) == [] and leaks(str(stored.result)) == [] and leaks(str(stored.context)) == []
    finished = [b for b in pushed if b and b.get("type") == "run.finished"]
    assert finished and leaks(str(pushed)) == []
    rt.store.drain_all()
    assert leaks(database_text(rt.store.engine)) == []
    cp = publish_checkpoint(SqlAuditReads(rt.store), tmp_path / "checkpoints")
    assert leaks(str(export_run(SqlAuditReads(rt.store), result.run_id, cp))) == []
    app = create_app(rt, ServiceSettings(housekeeping_interval_s=0.2, poll_interval_s=0.1,
                                         session_secret="test-secret-test-secret"))
    seen: list[str] = []
    with TestClient(app) as client:
        for path in (f"/api/v1/runs/{result.run_id}", f"/api/v1/runs/{result.run_id}/trace", "/api/v1/runs"):
            response = client.get(path, headers={"Authorization": f"Bearer {API_KEY}"})
            seen.append(f"{response.status_code} {response.text}")
    assert leaks("\n".join(seen)) == [], seen


def test_a_secret_in_a_failing_skills_message_is_filtered_too(rt: Runtime) -> None:
    """A skill that fails with secrets in its message leaves them in no outcome, error trace, Run error
    or table; the failure is still named."""
    failed = rt.runs.create_run({"task": "leak and fail", **TESS})
    assert failed.state == "CLOSED_FAILED" and "RuntimeError" in (failed.error or ""), failed.error
    assert "could not log in" in (failed.error or "") and "[REDACTED:" in (failed.error or ""), failed.error
    rt.store.drain_all()
    assert leaks(database_text(rt.store.engine)) == []
