"""A command imports only what it uses: heavy libraries load when their feature first runs, not at start.

Each check runs in a fresh interpreter and reads `sys.modules` at its end. Not a timed test: what it
keeps is which modules load, which is what the start time and the base memory of every process follow
(benchmarks/base_memory.py measures them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: never loaded by a command that does not use them
HEAVY = ("alembic", "detect_secrets", "requests", "fastapi", "uvicorn", "celery", "mcp", "opentelemetry.sdk",
         "torch", "sentence_transformers", "bpe_openai", "tiktoken", "httpx")
#: what `harness --help` does not load either: the composition root and the libraries beneath it
NOT_FOR_HELP = (*HEAVY, "harness.config", "sqlalchemy", "cedarpy", "jsonschema", "cryptography")
#: what a command on SQLite does not load until it needs it: the other backends' SQLAlchemy dialects, rich
#: (only to print for people), the trace models (only to write), the checkpoint signing and the archiver
NOT_AT_START = ("sqlalchemy.dialects.postgresql", "sqlalchemy.dialects.mysql", "rich", "cryptography",
                "harness.retention.archiver", "harness.adapters.webhook_http")
#: a Standard Webhooks secret for the send that nobody receives
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def modules_after(code: str, tmp_path: Path) -> set[str]:
    """The modules a fresh interpreter holds after running `code` (a database and data directory of
    its own under `tmp_path`)."""
    script = textwrap.dedent(code) + "\nimport json, sys\nprint('\\n' + json.dumps(sorted(sys.modules)))\n"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env |= {"HARNESS_DATABASE_URL": str(tmp_path / "harness.db"), "HARNESS_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout.rstrip().rsplit("\n", 1)[-1]))


def loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """Which of `names` (packages or modules) `modules` holds, itself or a submodule."""
    return [n for n in names if any(m == n or m.startswith(n + ".") for m in modules)]


def cli(*args: str) -> str:
    """Code that runs `harness ARGS` in-process, as the script does, and carries on after its exit."""
    return f"""
    import sys
    sys.argv = ["harness", *{list(args)!r}]
    from harness.cli import main
    try:
        main()
    except SystemExit as exc:
        assert not exc.code, exc.code
    """


def migrated(tmp_path: Path) -> None:
    """Create and migrate the database `modules_after` names, in an interpreter of its own."""
    modules_after("from harness.stores import open_store\nopen_store().close()", tmp_path)


def test_help_loads_no_database_policy_or_web_code(tmp_path: Path) -> None:
    """`harness --help` lists every command without importing what any of them runs."""
    assert loaded(modules_after(cli("--help"), tmp_path), NOT_FOR_HELP) == []


def test_a_command_loads_its_own_module_not_every_commands(tmp_path: Path) -> None:
    """`harness approve` imports the CLI module that defines it and builds only its own parameters: the other
    commands' modules (the archive, the server, the demo, audit, ...) stay unloaded (here for a request the
    database does not hold: the whole start, then exit 2)."""
    migrated(tmp_path)
    code = cli("approve", "01a00000-0000-7000-8000-000000000000", "--as", "carol")
    modules = modules_after(code.replace("assert not exc.code", "assert exc.code == 2"), tmp_path)
    assert "harness.pipeline.run_manager" in modules  # it did build the runtime
    assert sorted(m for m in modules if m.startswith("harness.cli")) == [
        "harness.cli", "harness.cli.runs", "harness.cli.startup", "harness.cli.support"]


def test_help_lists_every_command_of_the_table() -> None:
    """The lazily built group lists the same commands `COMMANDS` names, in its order, each with its help."""
    import typer.main

    from harness.cli import COMMANDS, app

    group = typer.main.get_command(app)
    assert list(group.commands) == list(COMMANDS)  # type: ignore[attr-defined]
    assert all(group.commands[name].help for name in COMMANDS)  # type: ignore[attr-defined]


def test_a_read_only_command_builds_its_runtime_without_the_heavy_libraries(tmp_path: Path) -> None:
    """Building the whole runtime (as `approve` does) on a current database loads no migration tool, no secret
    detectors, no tokenizer vocabulary, no web stack, no HTTP client, no Celery, MCP or OpenTelemetry SDK."""
    migrated(tmp_path)
    modules = modules_after("from harness.config import Settings, build_runtime\n"
                            "build_runtime(Settings.from_env()).close()", tmp_path)
    assert "harness.pipeline.run_manager" in modules
    assert loaded(modules, HEAVY) == []
    assert loaded(modules, NOT_AT_START) == []


@pytest.mark.parametrize(("name", "code", "module"), [
    ("a migration", "from harness.stores import open_store\nopen_store().close()", "alembic.runtime.migration"),
    ("a scrub", "from harness.context.secrets import SecretFilter\n"
                "assert SecretFilter().scrub('key AKIAQ7CANARY4EXAMPLE1').count", "detect_secrets"),
    ("a token count", "from harness.context.tokenizer import tokenizer_for\n"
                      "assert tokenizer_for('openai', 'gpt-4o').count('hello world')", "tiktoken"),
    ("a webhook sent", "from harness.wiring.webhooks import webhook_sender\n"
                       "from harness.domain.outbound import OutboundRule\n"
                       "s = webhook_sender(1.0)\n"
                       f"assert not s.send('http://127.0.0.1:9/', 'm1', '{{}}', {SECRET!r},\n"
                       "              rule=OutboundRule(any_internal=True)).ok\n"
                       "s.close()", "httpx"),
])
def test_a_lazy_library_loads_when_its_feature_first_runs(tmp_path: Path, name: str, code: str, module: str) -> None:
    """What is left out at start still loads, and works, the first time it is used."""
    assert module in modules_after(code, tmp_path), f"{module} not loaded by {name}"



def test_runs_show_reads_without_the_composition_root(tmp_path: Path) -> None:
    """`harness runs show` reads through the store alone: no pipeline, policy engine, Cedar or skills load
    (here for a Run the database does not hold: the same reads, then exit 2)."""
    migrated(tmp_path)
    code = cli("runs", "show", "no-such-run", "--json").replace("assert not exc.code", "assert exc.code == 2")
    shown = modules_after(code, tmp_path)
    assert "harness.stores" in shown
    assert loaded(shown, ("harness.config", "harness.pipeline.run_manager", "harness.policy", "cedarpy",
                          "harness.skills.manifests", "jsonschema", "harness.domain.traces", *NOT_AT_START)) == []


@pytest.mark.parametrize("args", [("trace", "no-such-run", "--json"), ("costs", "--json"),
                                  ("webhooks", "list", "--json")])
def test_a_command_that_reads_opens_the_store_alone(tmp_path: Path, args: tuple[str, ...]) -> None:
    """`trace`, `costs` and `webhooks list` read through the store: no composition root, pipeline, policy,
    Cedar or skills load (`trace` here of a Run the database does not hold: the same reads, then exit 2)."""
    migrated(tmp_path)
    code = cli(*args)
    if args[0] == "trace":
        code = code.replace("assert not exc.code", "assert exc.code == 2")
    read = modules_after(code, tmp_path)
    assert "harness.stores" in read
    assert loaded(read, ("harness.config", "harness.pipeline.run_manager", "harness.policy", "cedarpy",
                         "harness.skills.manifests", "jsonschema", *NOT_AT_START)) == []


def test_approvals_lists_without_the_composition_root_until_a_timeout_is_due(tmp_path: Path) -> None:
    """`harness approvals` reads the waiting requests through the store alone; the runtime (pipeline,
    policy, skills) loads only when a request's deadline has passed and its timeout must be applied."""
    migrated(tmp_path)
    listed = modules_after(cli("approvals", "--json"), tmp_path)
    assert "harness.stores" in listed
    assert loaded(listed, ("harness.config", "harness.pipeline.run_manager", "harness.policy", "cedarpy",
                           "harness.skills.manifests", "harness.domain.traces", *NOT_AT_START)) == []
