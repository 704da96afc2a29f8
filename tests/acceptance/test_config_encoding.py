"""A config file that is not UTF-8 text is bad input: every file the harness reads its configuration from
(policy, Cedar rules, identities, skill manifests, LLM rules, agent, config, webhooks, MCP, a webhook secret)
is refused with exit 2 and one line naming the file, by `harness run` and `harness serve`, never a
traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from harness.cli import app

NOT_UTF8 = b"a: \xff\n"

#: the variable that names a config file, and the name of the file (a policy file may be Cedar rules)
FILES = [("HARNESS_POLICY_FILE", "policy.yaml"), ("HARNESS_POLICY_FILE", "policies.cedar"),
         ("HARNESS_IDENTITIES", "identities.yaml"), ("HARNESS_LLM_RULES", "rules.yaml"),
         ("HARNESS_LLM_PRICING", "pricing.yaml"), ("HARNESS_AGENT", "agent.yaml"),
         ("HARNESS_CONFIG_FILE", "harness.yaml"), ("HARNESS_WEBHOOKS_FILE", "webhooks.yaml"),
         ("HARNESS_MCP_FILE", "mcp.yaml")]


def refused(result_code: int, output: str, named: Path) -> None:
    """The command ended with exit 2 and one line naming the file, without a traceback."""
    assert result_code == 2, output
    assert f"{named}: not UTF-8 text" in output, output
    assert "Traceback" not in output and "UnicodeDecodeError" not in output, output


@pytest.mark.parametrize(("variable", "name"), FILES, ids=[f"{v}-{n}" for v, n in FILES])
def test_run_refuses_a_config_file_that_is_not_utf8(tmp_path: Path, variable: str, name: str) -> None:
    """`harness run` with the file named by `variable` holding a byte UTF-8 has not: exit 2, the file named."""
    bad = tmp_path / name
    bad.write_bytes(NOT_UTF8)
    result = CliRunner().invoke(app, ["run", "hi", "--db", str(tmp_path / "h.db")], env={variable: str(bad)})
    refused(result.exit_code, result.output, bad)


def test_run_refuses_a_skill_manifest_that_is_not_utf8(tmp_path: Path) -> None:
    """A manifest in a skills folder that is not UTF-8 is refused like a malformed one."""
    skills = tmp_path / "skills"
    skills.mkdir()
    bad = skills / "broken.yaml"
    bad.write_bytes(b"id: \xfe\n")
    result = CliRunner().invoke(app, ["run", "hi", "--db", str(tmp_path / "h.db")],
                                env={"HARNESS_SKILLS_DIRS": str(skills)})
    refused(result.exit_code, result.output, bad)


def test_run_refuses_a_webhook_secret_file_that_is_not_utf8(tmp_path: Path) -> None:
    """An approver's secret file that is not UTF-8 is refused, naming the file (never its content)."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"whsec_\xff\xfe\n")
    hooks = tmp_path / "webhooks.yaml"
    hooks.write_text("approvers:\n  - {name: leads, tenant: acme, role: support_lead, "
                     f"url: https://chat.acme.example/hooks, secret_file: {secret}}}\n", encoding="utf-8")
    result = CliRunner().invoke(app, ["run", "hi", "--db", str(tmp_path / "h.db")],
                                env={"HARNESS_WEBHOOKS_FILE": str(hooks)})
    assert result.exit_code == 2, result.output
    assert f"the webhook secret in {secret} is not UTF-8 text" in result.output, result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(("variable", "name"), [("HARNESS_POLICY_FILE", "policies.cedar"),
                                                ("HARNESS_IDENTITIES", "identities.yaml")])
def test_serve_refuses_a_config_file_that_is_not_utf8(tmp_path: Path, variable: str, name: str) -> None:
    """`harness serve` refuses the file before it listens: exit 2, the file named, no traceback."""
    bad = tmp_path / name
    bad.write_bytes(NOT_UTF8)
    env = {**os.environ, variable: str(bad)}
    done = subprocess.run([sys.executable, "-m", "harness.cli", "serve", "--port", "0", "--db",
                           str(tmp_path / "h.db")], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False)
    refused(done.returncode, done.stderr, bad)
