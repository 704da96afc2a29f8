"""The `harness` command line: a thin shell over the library (SPEC U1).

One module per topic: runs (run, trace, cancel, approvals), demo, show (runs show), audit, archive,
webhooks (and costs), ops (sweep, worker), serve, replay, skills, witness, signer, kb (knowledge bases),
sandbox (the sandbox server);
support holds the options, the output helpers and the error handling they share.

A command's module is imported, and its parameters built, when the command is invoked (or listed by
`--help`): `harness approve` loads neither the archive nor the web server's command, nor builds their
options.
"""

from __future__ import annotations

import atexit
import gc
import importlib
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING

import typer
import typer.main
from typer.core import TyperGroup

from harness.cli.startup import script_starts
from harness.cli.support import cli_errors, make_app

if TYPE_CHECKING:
    from typer._click import Command

#: every command, in the order `harness --help` lists them: its name, the module that defines it and the
#: name there (a Typer there is a group of commands, a function one command)
COMMANDS: dict[str, tuple[str, str]] = {
    "costs": ("harness.cli.webhooks", "costs"),
    "run": ("harness.cli.runs", "run"),
    "trace": ("harness.cli.runs", "trace"),
    "cancel": ("harness.cli.runs", "cancel"),
    "approve": ("harness.cli.runs", "approve"),
    "reject": ("harness.cli.runs", "reject"),
    "approvals": ("harness.cli.runs", "approvals"),
    "demo": ("harness.cli.demo", "demo"),
    "sweep": ("harness.cli.ops", "sweep"),
    "serve": ("harness.cli.serve", "serve"),
    "replay": ("harness.cli.replay", "replay"),
    "worker": ("harness.cli.ops", "worker"),
    "archive": ("harness.cli.archive", "archive"),
    "erase": ("harness.cli.archive", "erase"),
    "runs": ("harness.cli.show", "runs_app"),
    "audit": ("harness.cli.audit", "audit_app"),
    "webhooks": ("harness.cli.webhooks", "webhooks_app"),
    "witness": ("harness.cli.witness", "witness_app"),
    "skills": ("harness.cli.skills", "skills_app"),
    "signer": ("harness.cli.signer", "signer_app"),
    "kb": ("harness.cli.kb", "kb_app"),
    "sandbox": ("harness.cli.sandbox", "sandbox_app"),
}


class LazyCommands(MutableMapping[str, "Command"]):
    """A group's commands by name: every name of COMMANDS is known, each command is built on first use."""

    def __init__(self, group: LazyGroup) -> None:
        self._group = group
        self._built: dict[str, Command] = {}

    def __getitem__(self, name: str) -> Command:
        if name not in self._built:
            if name not in COMMANDS:
                raise KeyError(name)
            self._built[name] = self._group.build(name)
        return self._built[name]

    def __setitem__(self, name: str, command: Command) -> None:
        self._built[name] = command

    def __delitem__(self, name: str) -> None:
        raise TypeError(f"the command {name!r} cannot be removed")

    def __iter__(self) -> Iterator[str]:
        return iter({**dict.fromkeys(COMMANDS), **self._built})

    def __len__(self) -> int:
        return len(COMMANDS.keys() | self._built.keys())


class LazyGroup(TyperGroup):
    """The `harness` group: its commands are those of COMMANDS, each imported and built by Typer as it is
    needed, exactly as `app.command(name)` / `app.add_typer(sub_app, name=name)` would build it."""

    def __init__(self, **attrs: object) -> None:
        super().__init__(**attrs)  # type: ignore[arg-type]
        self.commands = LazyCommands(self)

    def list_commands(self, ctx: object) -> list[str]:
        """The names, without building the commands."""
        return list(self.commands)

    def build(self, name: str) -> Command:
        """The click command `name`, from its module."""
        module, attribute = COMMANDS[name]
        target = getattr(importlib.import_module(module), attribute)
        holder = typer.Typer(rich_markup_mode=self.rich_markup_mode, pretty_exceptions_enable=False,
                             add_completion=False)
        if isinstance(target, typer.Typer):
            holder.add_typer(target, name=name)
        else:
            holder.command(name)(cli_errors(target))
        return typer.main.get_group(holder).commands[name]


app = make_app(LazyGroup)


def main() -> None:
    """Entry point of the `harness` script."""
    # At exit the interpreter's garbage collections traverse every object the command still holds (the
    # runtime, SQLAlchemy's and pydantic's structures: ~80,000 objects after an approve), ~0.1 s of CPU spent
    # finding nothing to free. Frozen, they are left to the process's end; atexit handlers registered later
    # (thread pools, logging) run before this one, and objects freed by reference counting are freed as before.
    atexit.register(gc.freeze)
    script_starts()  # the collector pauses while the command loads (harness.cli.startup)
    app()


__all__ = ["app", "main"]
