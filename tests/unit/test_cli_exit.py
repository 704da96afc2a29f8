"""The `harness` script's exit does not make the garbage collector walk what the command built."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    import atexit, gc, sys
    atexit.register(lambda: print("frozen", gc.get_freeze_count() > 0))  # registered first: runs last
    sys.argv = ["harness", "--help"]
    from harness.cli import main
    try:
        main()
    except SystemExit:
        pass
""")


def test_the_objects_of_a_command_are_frozen_at_exit(tmp_path: Path) -> None:
    """By the last exit handler every object the command still holds is frozen, so the interpreter's final
    collections skip them (~0.1 s of an approve's CPU)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.rstrip().endswith("frozen True")


AFTER_START = textwrap.dedent("""
    import atexit, gc, sys
    runs = []
    gc.callbacks.append(lambda phase, info: phase == "start" and runs.append(1))
    atexit.register(lambda: print("collections", len(runs)))
    atexit.register(lambda: print("collector on", gc.isenabled(), "frozen", gc.get_freeze_count() > 0))
    sys.argv = ["harness", *sys.argv[1:]]
    from harness.cli import main
    try:
        main()
    except SystemExit:
        pass
""")


def test_the_collector_pauses_for_the_start_only(tmp_path: Path) -> None:
    """The script pauses the garbage collector while a command loads and builds its runtime, then freezes
    what it built and turns the collector back on for the command's own work (a `serve` or a `sweep
    --forever` collects as before)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env |= {"HARNESS_DATABASE_URL": str(tmp_path / "harness.db"), "HARNESS_DATA_DIR": str(tmp_path / "data")}
    done = subprocess.run([sys.executable, "-c", AFTER_START, "cancel", "no-such-run"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert "no run with id" in done.stderr, done.stderr[-2000:]  # refused after building the runtime
    on, collections = done.stdout.rstrip().splitlines()[-2:]
    assert on == "collector on True frozen True"
    # ~200 collections when the collector runs through the start; ~30 (the imports before the script's entry
    # point, the command's own work) when it is paused
    assert int(collections.split()[1]) < 100, collections


def test_a_program_calling_the_app_keeps_its_collector(tmp_path: Path) -> None:
    """The app invoked from Python (CliRunner, a user's script) neither pauses nor freezes anything."""
    from typer.testing import CliRunner

    from harness.cli import app

    frozen = gc.get_freeze_count()
    result = CliRunner().invoke(app, ["cancel", "no-such-run", "--db", str(tmp_path / "harness.db")],
                                env={"HARNESS_DATA_DIR": str(tmp_path / "data")})
    assert result.exit_code == 2, result.output
    assert gc.isenabled()
    # nothing newly frozen (a command's start would freeze ~100,000 objects); the count may drop, as objects
    # frozen earlier (the test session freezes what its collection built) are freed meanwhile
    assert gc.get_freeze_count() <= frozen


STARTED = textwrap.dedent("""
    import gc, importlib, sys
    module, owner, method = sys.argv[1].replace(":", ".").split(".")
    runs = []
    gc.callbacks.append(lambda phase, info: phase == "start" and runs.append(1))
    def answer(self, *args, **kwargs):  # built and about to serve or take tasks: what the start did
        print("collections", len(runs), "collector on", gc.isenabled(), "frozen", gc.get_freeze_count() > 0)
    setattr(getattr(importlib.import_module(module), owner), method, answer)
    sys.argv = ["harness", *sys.argv[2:]]
    from harness.cli import main
    main()
""")


@pytest.mark.parametrize(("entered", "argv"), [
    ("uvicorn:Server.run", ["serve", "--port", "0"]),
    ("celery:Celery.worker_main", ["worker", "--broker", "redis://127.0.0.1:6379/0"]),
], ids=["serve", "worker"])
def test_a_long_running_command_starts_with_the_collector_paused(tmp_path: Path, entered: str,
                                                                 argv: list[str]) -> None:
    """`harness serve` and `harness worker` check their settings, make the schema current and build the
    service or Celery's app (~280 collections for serve with the collector on) with the collector paused,
    then freeze what they built and serve with it on."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HARNESS_")}
    env |= {"HARNESS_DATABASE_URL": str(tmp_path / "harness.db"), "HARNESS_DATA_DIR": str(tmp_path / "data")}
    for _ in range(2):  # a new database (migrated), then one whose schema is current
        done = subprocess.run([sys.executable, "-c", STARTED, entered, *argv], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        collections, on = done.stdout.rstrip().splitlines()[-1].split(" collector on ")
        assert on == "True frozen True"
        assert int(collections.split()[1]) < 100, collections
