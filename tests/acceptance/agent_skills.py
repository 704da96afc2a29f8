"""The agent skills, scripted rules and settings the AgentInvoke tests share (in this process and in
the worker and CLI processes of the integration tests): kept light, so a spawned process imports fast."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from harness.settings import Settings
from tests.sqlite_template import migrated_sqlite

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TESTER = {"tenant_id": "t1", "user_id": "tess", "roles": ["tester"]}

SKILLS = '''
import json, os, time

def echo(args, ctx):
    return dict(args)

def fail(args, ctx):
    raise RuntimeError("the child's tool broke")

def nap(args, ctx):
    time.sleep(args["seconds"])
    return {"slept": args["seconds"]}

def purge(args, ctx):
    time.sleep(0.3)  # long enough for a waiting parent to look at its child mid-call
    with open(os.environ["HARNESS_TEST_CALL_LOG"], "a") as log:  # the side effect tests count
        log.write(json.dumps({"skill": "test.purge", "key": ctx.idempotency_key}) + "\\n")
    return {"purged": args["what"]}
'''

MANIFESTS: dict[str, dict[str, Any]] = {
    "test.say": {"entrypoint": "agents.py:echo"},
    "test.broken": {"entrypoint": "agents.py:fail"},
    "test.nap": {"entrypoint": "agents.py:nap"},
    "test.purge": {"entrypoint": "agents.py:purge", "risk": {"access": "write", "space": "personal",
                                                             "impact": "high"}},  # L3: a named approver
    "test.delegate": {"kind": "agent", "prompt": "say {text}", "timeout_s": 600},
    "test.delegate_broken": {"kind": "agent", "prompt": "break"},
    "test.delegate_nap": {"kind": "agent", "prompt": "nap"},
    "test.delegate_purge": {"kind": "agent", "prompt": "purge {what}", "timeout_s": 600},
    "test.delegate_deeper": {"kind": "agent", "prompt": "recurse"},
}


def one_step(name: str, when: str, skill: str, arguments: dict[str, Any], answer: str = "") -> dict[str, Any]:
    return {"name": name, "when": when, "plan": {"answer_template": answer, "steps": [
        {"id": "a", "tool_call": {"skill": skill, "arguments": arguments}, "output_key": "a"}]}}


RULES = [
    one_step("say", "^say (?P<text>.+)$", "test.say", {"text": "{text}"}, "{a.text}"),
    one_step("break", "^break$", "test.broken", {}),
    one_step("nap", "^nap$", "test.nap", {"seconds": 2}),
    one_step("purge", "^purge (?P<what>\\w+)$", "test.purge", {"what": "{what}"}, "purged {a.purged}"),
    one_step("recurse", "^recurse$", "test.delegate_deeper", {}, "deeper: {a.answer}"),
    one_step("delegate_purge", "^delegate purge (?P<what>\\w+)$", "test.delegate_purge", {"what": "{what}"},
             "child said {a.answer}"),
    one_step("delegate_broken", "^delegate breakage$", "test.delegate_broken", {}),
    one_step("delegate_nap", "^delegate a nap$", "test.delegate_nap", {}),
    # the generic rule last: the more specific "delegate ..." rules must match first
    one_step("delegate", "^delegate (?P<text>.+)$", "test.delegate", {"text": "{text}"}, "child said {a.answer}"),
]


def agent_settings(folder: Path, limit_s: float = 30.0, db: str | None = None, **extra: Any) -> Settings:
    """Write the agent skills and rules into `folder` (once) and return settings over them."""
    skills = folder / "skills"
    if not skills.exists():
        skills.mkdir()
        (skills / "agents.py").write_text(SKILLS)
        for skill_id, more in MANIFESTS.items():
            manifest = {"id": skill_id, "version": "1.0.0", "input_schema": {"type": "object"},
                        "risk": {"access": "read"}, "timeout_s": 5, **more}
            (skills / f"{skill_id.split('.')[1]}.yaml").write_text(yaml.safe_dump(manifest))
        (folder / "rules.yaml").write_text(yaml.safe_dump({"rules": RULES}))
    return Settings(db=db or migrated_sqlite(folder / "rt.db"), skills_dirs=(skills,),
                    policy_file=FIXTURES / "policy.yaml", llm_rules=folder / "rules.yaml",
                    identities_file=FIXTURES / "identities.yaml", data_dir=folder / "data",
                    execution_limit_s=limit_s, **extra)
