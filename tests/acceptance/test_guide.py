"""The "write your own agent" guide works as written: its files are written out and its program run."""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes import openai_api as api
from tests.fakes.server import ScriptedServer

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide-your-own-agent.md"
BLOCK = re.compile(r"^```(\w+)(?: ([\w./-]+))?\n(.*?)^```$", re.S | re.M)


def _blocks() -> list[tuple[str, str | None, str]]:
    return [(m.group(1), m.group(2), m.group(3)) for m in BLOCK.finditer(GUIDE.read_text(encoding="utf-8"))]


def test_the_guides_program_runs_and_prints_what_the_guide_says(tmp_path: Path) -> None:
    """Every file the guide names is written as shown; main.py runs to the end (its own asserts hold:
    a chat turn succeeds, a two-round Run parks for a lead, the requester cannot approve it, the lead
    can, and both rounds passed policy) and prints the output the guide shows."""
    files = [(path, body) for _, path, body in _blocks() if path]
    assert [p for p, _ in files][-1] == "main.py"
    for path, body in files:
        (tmp_path / path).write_text(body, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env["PYTHONPATH"] = str(tmp_path)
    done = subprocess.run([sys.executable, "main.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    (shown,) = [body for lang, path, body in _blocks() if lang == "text" and path is None]
    assert done.stdout == shown


def test_the_guide_names_only_settings_that_exist() -> None:
    """Every HARNESS_* variable the guide mentions is one the reference page documents."""
    reference = (GUIDE.parent / "reference.md").read_text(encoding="utf-8")
    for name in set(re.findall(r"HARNESS_[A-Z_]+", GUIDE.read_text(encoding="utf-8"))):
        assert f"`{name}`" in reference, name


@pytest.fixture
def server() -> Iterator[ScriptedServer]:
    """A chat-completions server on an ephemeral loopback port."""
    with ScriptedServer() as srv:
        yield srv


def test_the_guides_agent_runs_against_an_openai_compatible_endpoint(server: ScriptedServer, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The same agent with the settings of the guide's last section: each round's plan and the answer come
    from the endpoint; the model is told the agent's instructions, then sees round 1's result before it
    plans round 2, and writes the answer from the results."""
    for _, path, body in _blocks():
        if (path and path.endswith(".py") and path != "main.py") or (path and not path.endswith(".py")):
            (tmp_path / path).write_text(body, encoding="utf-8")
    (tmp_path / "prices.yaml").write_text("models:\n  my-model: {input_per_mtok: 1.0, output_per_mtok: 2.0}\n")
    for key, value in (("HARNESS_LLM", "openai"), ("HARNESS_LLM_BASE_URL", f"{server.origin}/v1"),
                       ("HARNESS_LLM_MODEL", "my-model"), ("HARNESS_LLM_API_KEY_ENV", "MY_ENDPOINT_KEY"),
                       ("MY_ENDPOINT_KEY", "test-key"), ("HARNESS_LLM_PRICING", str(tmp_path / "prices.yaml"))):
        monkeypatch.setenv(key, value)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("helpdesk_agent", "helpdesk_skills"):
        sys.modules.pop(name, None)
    helpdesk = importlib.import_module("helpdesk_agent").helpdesk
    lookup = {"steps": [{"id": "lookup", "tool_call": {"skill": "accounts.lookup", "arguments": {"user": "jdoe"}},
                         "output_key": "account"}], "then": "next_round"}
    unlock = {"steps": [{"id": "unlock", "tool_call": {"skill": "accounts.unlock", "arguments": {"user": "jdoe"}},
                         "output_key": "unlocked"}], "then": "answer"}
    server.queue(api.completion(json.dumps(lookup), model="my-model"),
                 api.completion(json.dumps(unlock), model="my-model"),
                 api.completion("Done: jdoe can sign in again.", model="my-model"))
    from harness import Harness

    with Harness(helpdesk, db=str(tmp_path / "real.db"), data_dir=tmp_path / "data") as h:
        run = h.run("Please unlock the account of jdoe", user="sam")
        assert run.state == "AWAITING_HITL", run.error
        done = h.approve(run.approval_request_id, as_="lee").run
        assert done.state == "SUCCEEDED" and done.answer == "Done: jdoe can sign in again."
    first, second, answer = (r.body for r in server.received)
    assert first["model"] == "my-model" and first["messages"][0]["role"] == "system"
    assert first["messages"][0]["content"].startswith("You are the IT helpdesk agent.")
    assert {t["function"]["name"] for t in first["tools"]} == {"accounts__lookup", "accounts__unlock"}  # wire names
    assert '"locked": true' in second["messages"][-1]["content"]  # round 1's result, shown before round 2
    assert '"ticket": "T-unlock"' in answer["messages"][-1]["content"] and "tools" not in answer
