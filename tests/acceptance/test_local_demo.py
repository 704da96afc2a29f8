"""`harness demo --llm local`: each scenario is offered the one skill it needs and says whether it came out
as expected, with a total; here against an OpenAI-compatible server on loopback that always plans an
order lookup (HARNESS_LLM_BASE_URL: the demo then starts no model of its own). The real model's runs are
tests/integration/test_local_model.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app
from harness.cli.demo import LOCAL_SCENARIOS
from tests.fakes.slow_model import SlowModel


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HARNESS_DATABASE_URL", str(tmp_path / "demo.db"))
    monkeypatch.setenv("HARNESS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.delenv("HARNESS_LLM_BASE_URL", raising=False)
    monkeypatch.delenv("HARNESS_LOCAL_MODEL_PATH", raising=False)
    return tmp_path


def test_each_scenario_gets_a_verdict_and_the_demo_a_total(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A model that can only look orders up passes the scenarios an order lookup answers and fails the
    others: a PASS or FAIL line each, naming what was expected and what came, a total, and exit 1."""
    with SlowModel(delay_s=0.0) as model:
        monkeypatch.setenv("HARNESS_LLM_BASE_URL", model.url)
        shown = CliRunner().invoke(app, ["demo", "--llm", "local"])
    assert shown.exit_code == 1, shown.output
    verdicts = [line.strip() for line in shown.stdout.splitlines() if line.strip().startswith(("PASS", "FAIL"))]
    assert len(verdicts) == len(LOCAL_SCENARIOS), shown.stdout
    assert verdicts[0] == "PASS: expected SUCCEEDED, got SUCCEEDED"  # the order lookup
    assert verdicts[1].startswith("FAIL: expected SUCCEEDED, got ")  # a customer: no order lookup offered
    passed = sum(v.startswith("PASS") for v in verdicts)
    assert f"{passed} of {len(LOCAL_SCENARIOS)} scenarios came out as expected" in shown.stdout
    assert "(offered: orders_lookup)" in shown.stdout and "(offered: customers_lookup)" in shown.stdout


def test_the_json_document_counts_what_passed(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with SlowModel(delay_s=0.0) as model:
        monkeypatch.setenv("HARNESS_LLM_BASE_URL", model.url)
        shown = CliRunner().invoke(app, ["demo", "--llm", "local", "--json"])
    doc = json.loads(shown.stdout)
    assert doc["scenarios"] == len(LOCAL_SCENARIOS) == len(doc["runs"])
    assert doc["passed"] == sum(r["passed"] for r in doc["runs"]) >= 1
    assert all(r["passed"] == (r["state"] == r["expected"]) for r in doc["runs"])


@pytest.mark.parametrize(("content", "problem"), [(None, "is not a file"), (b"not a model", "is not a GGUF")])
def test_a_model_path_that_is_not_a_gguf_file_is_named(env: Path, monkeypatch: pytest.MonkeyPatch,
                                                       content: bytes | None, problem: str) -> None:
    """HARNESS_LOCAL_MODEL_PATH serves any GGUF model; a path that is not one is exit 2 naming it, before a
    server starts."""
    path = env / "model.gguf"
    if content is not None:
        path.write_bytes(content)
    monkeypatch.setenv("HARNESS_LOCAL_MODEL_PATH", str(path))
    shown = CliRunner().invoke(app, ["demo", "--llm", "local"])
    assert shown.exit_code == 2, shown.output
    assert f"HARNESS_LOCAL_MODEL_PATH: {path} {problem}" in shown.output and "Traceback" not in shown.output
