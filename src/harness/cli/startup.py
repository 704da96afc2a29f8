"""The cyclic garbage collector while a `harness` command starts.

A command's start allocates what it keeps until it exits: its modules, Typer's command, the runtime
(SQLAlchemy's and pydantic's structures, the agent's skills and policy), ~100,000 objects for an approve.
The collector, run every 700 allocations, walks them again and again and finds nothing to free: ~0.04 s
of an approve's ~0.45 s of CPU. In the `harness` script's own process the start runs with the collector
paused and what it built is frozen (`gc.freeze`: left out of every later collection); the command's own
work runs with the collector on, as before. A program that calls the app itself (the tests' CliRunner, a
user's script) keeps its collector as it is.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


class _Script:
    """Whether this process is the `harness` script's, or one it started for its work (set once, by its entry
    point)."""

    own = False


def script_starts() -> None:
    """The `harness` script begins: pause the collector until the command runs (`command_runs`)."""
    _Script.own = True
    gc.disable()


def process_is_own() -> None:
    """This process was started to run a `harness` command's work (a service process of `serve --processes`),
    not by a program that embeds harness: what it builds to keep may be built with the collector paused."""
    _Script.own = True


def command_runs() -> None:
    """The command's module is loaded and it is about to run: freeze what the start built and resume the
    collector (nothing when the script did not pause it)."""
    if _Script.own and not gc.isenabled():
        gc.freeze()
        gc.enable()


@contextmanager
def kept_until_exit() -> Iterator[None]:
    """Build something the command keeps until it exits (its runtime): in the script's process with the
    collector paused, then frozen; elsewhere as it is."""
    if not _Script.own or not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
