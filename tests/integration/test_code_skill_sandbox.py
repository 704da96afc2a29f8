"""`@skill` code runs with the harness process's privileges unless it is declared `sandbox=True`: then each call
runs out of process under bubblewrap, where the process's secrets (environment, database file, signing key) are
out of reach. Both skills are real (tests/fakes/prying_skills.py) and run through real Runs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from harness import Agent, Harness
from harness.adapters.sandbox.bwrap import unavailable_reason
from harness.domain.errors import ManifestError

from ..fakes.prying_skills import pry_in_process, pry_sandboxed

SECRETS = {"OPENAI_API_KEY": "sk-test-0123456789abcdefghijklmnopqrstuv",
           "HARNESS_WEBHOOK_SECRET": "whsec_dGVzdC13ZWJob29rLXNlY3JldC0wMTIzNDU2Nzg5YWI="}
CEDAR = 'permit (principal in Role::"agent", action == Action::"call", resource in SkillGroup::"probe");\n'
POLICY = "version: 1\npermissions: {cedar: p.cedar}\n"
IDENTITIES = "identities:\n  default/ana: {roles: [agent]}\n"


def _rules(paths: list[str]) -> str:
    arguments = json.dumps({"variables": sorted(SECRETS), "paths": paths})
    return "rules:\n" + "".join(
        f"  - name: {name}\n    when: '^pry {name}$'\n    plan:\n      steps: [{{id: pry, tool_call: {{skill: "
        f"probe.{name}, arguments: {arguments}}}, output_key: found}}]\n"
        for name in ("sandboxed", "in_process"))


@pytest.fixture
def prying(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A Harness (bubblewrap sandbox) whose agent has both prying skills; the process holds two secrets in its
    environment, its database file and a private key file."""
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get("HARNESS_REQUIRE_SERVICES") == "1":
            pytest.fail(f"bubblewrap is required here: {reason}")
        pytest.skip(f"bubblewrap unavailable: {reason}")
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    db, key = tmp_path / "harness.db", tmp_path / "keys" / "signing.pem"
    key.parent.mkdir(mode=0o700)
    key.write_text("-----BEGIN PRIVATE KEY-----\nnot a real key\n-----END PRIVATE KEY-----\n")
    key.chmod(0o600)
    for name, text in (("rules.yaml", _rules([str(db), str(key)])), ("p.cedar", CEDAR), ("policy.yaml", POLICY),
                       ("ids.yaml", IDENTITIES)):
        (tmp_path / name).write_text(text)
    agent = Agent(name="pry", instructions="Pry.", skills=[pry_sandboxed, pry_in_process],
                  policy=tmp_path / "policy.yaml", identities=tmp_path / "ids.yaml", llm_rules=tmp_path / "rules.yaml")
    with Harness(agent, db=str(db), data_dir=tmp_path / "data", sandbox="bwrap") as h:
        yield h, db, key


def test_a_sandboxed_code_skill_cannot_read_the_processs_secrets(prying: Any) -> None:
    """`@skill(sandbox=True)` runs in another process under bubblewrap: the harness's environment secrets, its
    database file and a key file are not there; the call is traced as a sandbox call with bwrap isolation."""
    h, db, key = prying
    done = h.run("pry sandboxed", user="ana")
    assert done.state == "SUCCEEDED", done.error
    found = done.artifacts["found"]
    assert found["env"] == {name: False for name in SECRETS}
    assert found["files"] == {str(db): "FileNotFoundError", str(key): "FileNotFoundError"}
    assert found["pid"] != os.getpid()
    (tool,) = [t.data for t in h.trace(done.run_id) if t.kind == "tool"]
    assert (tool["call_kind"], tool["isolation"], tool["status"]) == ("sandbox", "bwrap", "ok")


def test_an_unsandboxed_code_skill_reads_them_as_documented(prying: Any) -> None:
    """Without `sandbox=True` the same code, declared read-only, runs in the harness process and reads its
    secrets, its database and the key: what the docs warn a skill author of."""
    h, db, key = prying
    done = h.run("pry in_process", user="ana")
    assert done.state == "SUCCEEDED", done.error
    found = done.artifacts["found"]
    assert found["env"] == {name: True for name in SECRETS} and found["pid"] == os.getpid()
    assert found["files"][str(db)].startswith("read ") and found["files"][str(key)].startswith("read ")


def test_a_sandboxed_skill_keeps_its_contract() -> None:
    """A sandboxed code skill is a python skill run in the sandbox, pinned to its module's code; its function
    is still callable as written, and one defined inside a function is refused (the sandbox imports it by
    name)."""
    manifest, entry = pry_sandboxed.manifest, pry_sandboxed.skill.entry
    assert manifest.sandbox and manifest.call_kind == "sandbox" and not manifest.network
    assert entry is not None and entry.module == "tests.fakes.prying_skills" and entry.function == "pry_sandboxed"
    assert pry_in_process.skill.entry is None and pry_in_process.manifest.call_kind == "local"
    assert pry_sandboxed(variables=[], paths=[]).pid == os.getpid()
    from harness import skill

    with pytest.raises(ManifestError, match="top level"):
        @skill("probe.nested", sandbox=True)  # type: ignore[untyped-decorator]  # harness.skill is lazy: Any
        def nested(x: int) -> dict[str, int]:
            return {"x": x}
