"""Skills and rules of the sandbox-instance tests, over the agent skills. A wait for a human between two
calls of a Run's instance's skill comes from a child Run that parks for approval, or from the Run itself:
its second round holds an L3 step, so it parks before that round runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from harness.settings import Settings
from tests.acceptance.agent_skills import RULES, agent_settings, one_step

SKILLS = '''
import json, os, socket, subprocess, sys, time, urllib.request
from pathlib import Path

SERVER = """
import http.server, os, sys
os.chdir(sys.argv[2])
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), http.server.SimpleHTTPRequestHandler).serve_forever()
"""


def _serve(workdir, port):
    """Start the site's server from what the working directory holds, in a session of its own."""
    subprocess.Popen([sys.executable, "-I", str(workdir / "server.py"), str(port), str(workdir / "site")],
                     start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 5
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def devserver(args, ctx):
    """start: write a site and serve it on the leased port; query: fetch it (serving it again from the
    preserved working directory when the instance was re-created and its server is gone)."""
    workdir, port = Path(ctx.workdir), int(os.environ["HARNESS_PORT_0"])
    generation = int(os.environ["HARNESS_SANDBOX_GENERATION"])
    if args["action"] == "start":
        (workdir / "site").mkdir(exist_ok=True)
        (workdir / "site" / "index.html").write_text(args["text"])
        (workdir / "server.py").write_text(SERVER)
        _serve(workdir, port)
        return {"port": port, "generation": generation}
    restarted = False
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        _serve(workdir, port)
        restarted = True
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/index.html", timeout=5) as answer:
        body = answer.read().decode()
    return {"port": port, "body": body, "generation": generation, "restarted": restarted}


def probe(args, ctx):
    """Whether anything answers on 127.0.0.1:port from this call's sandbox."""
    try:
        socket.create_connection(("127.0.0.1", int(args["port"])), timeout=0.5).close()
        return {"reached": True}
    except OSError as exc:
        return {"reached": False, "error": type(exc).__name__}


def hold(args, ctx):
    """Wait until the release file exists (the rlimit sandbox sees the host's files)."""
    deadline = time.monotonic() + args["seconds"]
    while not os.path.exists(args["until"]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return {"held": True, "port": os.environ.get("HARNESS_PORT_0")}
'''

MANIFESTS: dict[str, dict[str, Any]] = {
    "test.devserver": {"entrypoint": "instances.py:devserver", "persistent": True, "ports": 1, "timeout_s": 10},
    "test.devserver_quick": {"entrypoint": "instances.py:devserver", "persistent": True, "ports": 1,
                             "timeout_s": 0.3},
    "test.probe": {"entrypoint": "instances.py:probe", "persistent": True, "timeout_s": 10},
    "test.hold": {"entrypoint": "instances.py:hold", "ports": 1, "timeout_s": 120},
    "test.hold_short": {"entrypoint": "instances.py:hold", "ports": 1, "timeout_s": 1},
}

SERVE_THEN_WAIT = {"name": "serve_wait", "when": "^serve (?P<text>\\w+) then wait$", "plan": {
    "answer_template": "the site said {c.body}",
    "steps": [
        {"id": "a", "tool_call": {"skill": "test.devserver", "arguments": {"action": "start", "text": "{text}"}},
         "output_key": "a"},
        {"id": "b", "tool_call": {"skill": "test.delegate_purge", "arguments": {"what": "cache"}},
         "depends_on": ["a"], "output_key": "b"},
        {"id": "c", "tool_call": {"skill": "test.devserver", "arguments": {"action": "query"}},
         "depends_on": ["b"], "output_key": "c"},
    ]}}

#: round 1 starts the server; round 2 (planned from its result) purges (L3: the Run parks for a named
#: approver before the round runs), then queries the server
SERVE_THEN_ASK = {"name": "serve_ask", "when": "^serve (?P<text>\\w+) then ask$", "plan": {
    "then": "next_round",
    "steps": [
        {"id": "a", "tool_call": {"skill": "test.devserver", "arguments": {"action": "start", "text": "{text}"}},
         "output_key": "a"},
    ]}}
SERVE_THEN_ASK_SECOND = {"name": "serve_ask_second", "round": 2, "when": "^serve (?P<text>\\w+) then ask$",
                         "results": '"port": (?P<port>\\d+)', "plan": {
    "answer_template": "the site on port {port} said {c.body}",
    "steps": [
        {"id": "b", "tool_call": {"skill": "test.purge", "arguments": {"what": "cache"}}, "output_key": "b"},
        {"id": "c", "tool_call": {"skill": "test.devserver", "arguments": {"action": "query"}},
         "depends_on": ["b"], "output_key": "c"},
    ]}}

INSTANCE_RULES = [
    SERVE_THEN_WAIT,
    SERVE_THEN_ASK,
    SERVE_THEN_ASK_SECOND,
    one_step("serve", "^serve (?P<text>\\w+)$", "test.devserver", {"action": "start", "text": "{text}"}),
    one_step("quick_serve", "^quickly serve (?P<text>\\w+)$", "test.devserver_quick",
             {"action": "start", "text": "{text}"}),
    one_step("probe", "^probe (?P<port>\\d+)$", "test.probe", {"port": "{port}"}),
    one_step("hold", "^hold until (?P<path>\\S+)$", "test.hold", {"until": "{path}", "seconds": 100}),
    one_step("hold_short", "^briefly hold until (?P<path>\\S+)$", "test.hold_short",
             {"until": "{path}", "seconds": 0.1}),
]


def instance_settings(folder: Path, db: str | None = None, **extra: Any) -> Settings:
    """The agent skills plus the instance skills in `folder`, with settings over them."""
    settings = agent_settings(folder, db=db, **extra)
    skills = folder / "skills"
    if not (skills / "instances.py").exists():
        (skills / "instances.py").write_text(SKILLS)
        for skill_id, more in MANIFESTS.items():
            manifest = {"id": skill_id, "version": "1.0.0", "input_schema": {"type": "object"},
                        "risk": {"access": "read"}, "sandbox": True, **more}
            (skills / f"{skill_id.split('.')[1]}.yaml").write_text(yaml.safe_dump(manifest))
        (folder / "rules.yaml").write_text(yaml.safe_dump({"rules": INSTANCE_RULES + RULES}))
    return settings
