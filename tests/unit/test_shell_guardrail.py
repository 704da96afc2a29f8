"""The shell guardrail (SPEC G1, defence in depth behind the sandbox): a command that would delete / or
everything in it is refused however it is spelled, and ordinary commands still pass."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from harness.config import Runtime
from harness.examples.support import EXAMPLE_DIR
from harness.policy.config import Guardrail
from harness.policy.guardrails import matches
from harness.policy.shell import wipes

#: the bundled example's rule, as the gatekeeper applies it
RULE = Guardrail.model_validate(next(g for g in yaml.safe_load((EXAMPLE_DIR / "policy.yaml").read_text())
                                     ["guardrails"] if g["id"] == "no_wiping_the_root"))

WIPES = [
    "rm -rf /", "rm -fr /*", "rm -r -f / --no-preserve-root", "rm --recursive --force /", "cd x && rm -r -f /",
    'rm -rf "/"', "rm -rf '/'", "rm -rf /.", "rm -rf //", "rm -rf ///", "rm -rf /./", "rm -rf /tmp/..",
    "rm -rf /tmp/../", "/bin/rm -rf /", "/usr/bin/rm -rf /*", "\\rm -rf /", "sudo rm -rf /",
    "sudo -u root rm -rf /", "env LANG=C rm -rf /", "nice -n 10 rm -rf /", "timeout 5 rm -Rf /",
    "find / -delete", "find / -mindepth 1 -delete", "find / -exec rm -rf {} +", "find // -name '*' -delete",
    "cd / && rm -rf *", "cd /; rm -rf *", "cd / || true; rm -rf .", "cd /tmp && rm -rf ../*", "(cd / && rm -rf *)",
    "ls; rm -rf /", "ls && rm -rf /", "false || rm -rf /", "true | rm -rf /", "sleep 1 & rm -rf /",
    "ls\nrm -rf /", "sh -c 'rm -rf /'", 'bash -c "cd / && rm -rf *"', "bash -lc 'rm -rf /'", "eval 'rm -rf /'",
    'rm -rf "$UNSET_DIR/"*', "X=/; rm -rf $X", "export T=/ && rm -rf ${T}", "rm -rf /.*", "rm -rf /{bin,etc}",
    "rm -rf $(echo /)", "echo / | xargs rm -rf", "cd ../../../../../../ && rm -rf *", "rm -rf ../../..",
    "cd $SOMEWHERE && rm -rf *", "rm -rf / 2>/dev/null", 'rm -rf "/" > /dev/null 2>&1', "RM=1 rm -rf /",
    "rm -rf 'unbalanced", "echo $(rm -rf /)", "`rm -rf /`", "rm -rf /home/..", "ls $(cd / && rm -rf *)",
]
PASSES = [
    "ls -la /", "rm -rf build", "rm -rf ./build/", "rm -rf /tmp/scratch", "rm -rf /tmp/*", "rm -f /tmp/a.txt",
    "rm -f *", "rm -rf *", "rm -rf .cache", "rm notes.txt", "find . -name '*.pyc' -delete",
    "find /tmp/x -type f -delete", "find / -name passwd", "cd / && ls", "cd /tmp && rm -rf *",
    'echo "rm -rf /"', "grep -r 'rm -rf /' docs", "echo hello > f.txt && cat f.txt && pwd",
    "mkdir -p out && cp -r src out/", "python3 -c 'print(1)'", "cat /etc/hostname", "du -sh /",
    "X=/tmp/work; rm -rf $X", "tar czf /tmp/backup.tgz .", "git clean -fdx", "rm -rf -- ./-weird",
    "echo $(date) > f.txt", "ls `pwd`", "sh -c 'ls /'",
]


@pytest.mark.parametrize("command", WIPES)
def test_every_spelling_of_wiping_the_root_is_refused(command: str) -> None:
    """The example's guardrail trips on the command, and says why."""
    assert matches(RULE, command), command
    assert wipes(command)


@pytest.mark.parametrize("command", PASSES)
def test_ordinary_commands_still_pass(command: str) -> None:
    """Commands that stay in the working directory, touch other paths or only read are let through."""
    assert not matches(RULE, command), wipes(command)


def test_other_protected_directories_and_bad_rules() -> None:
    """A rule may protect other directories (their ancestors and globs of their entries too); a rule that
    names no absolute path is refused when the policy file loads."""
    assert wipes("rm -rf /srv/data/", ("/srv/data",)) and wipes("rm -rf /srv", ("/srv/data",))
    assert wipes("cd /srv/data && rm -rf *", ("/srv/data",)) and not wipes("rm -rf /srv/other", ("/srv/data",))
    for bad in ("relative/dir", [], ["/", 3]):
        with pytest.raises(ValueError, match="shell_wipes needs an absolute path"):
            Guardrail(id="g", skill="shell.exec", argument="command", op="shell_wipes", value=bad, verdict="reject")


def test_the_example_policy_uses_the_parsing_rule() -> None:
    """The bundled policy protects / with the parsing rule, not a regex."""
    assert (RULE.op, RULE.protected) == ("shell_wipes", ("/",))
    assert Path(EXAMPLE_DIR / "policy.yaml").read_text().count("shell_wipes") == 1


OPERATOR = {"tenant_id": "default", "user_id": "operator", "roles": ["operator", "support_agent"]}


@pytest.mark.parametrize("command", ['rm -rf "/"', "cd / && rm -rf *", "find / -delete"])
def test_the_gatekeeper_rejects_the_variants_before_anything_runs(support_runtime: Runtime, command: str) -> None:
    """Through the whole pipeline: the shell.exec Run is rejected at policy check, no sandbox call made."""
    result = support_runtime.runs.create_run({"task": f"run: {command}", **OPERATOR})
    assert result.state == "CLOSED_REJECTED" and "no_wiping_the_root" in (result.error or "")
    assert "EXECUTING" not in result.path
