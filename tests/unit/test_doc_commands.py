"""Every `harness` and `harness-verify` command the README and the docs show is one the CLI accepts as
written: its subcommands exist, its options are known and its values convert (nothing is run)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
import typer.main

from harness.audit.standalone import _parser as verify_parser
from harness.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]


def doc_commands(path: str) -> list[str]:
    """The command lines of a document's code blocks (comments cut, `&&` and pipes split)."""
    found, in_block = [], False
    for line in (ROOT / path).read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_block = not in_block
        elif in_block:
            found += [p.strip() for p in re.split(r"\s(?:&&|\||;)\s", line.split("  #")[0])
                      if re.match(r"^harness(-verify)?\s", p.strip())]
    return [c for c in found if "--help" not in c]


def inline_commands(path: str) -> list[str]:
    """The commands a document's text names inline (`harness runs show RUN_ID`): often without the
    arguments a full line needs, so only their subcommands and options are checked."""
    found = re.findall(r"`(harness(?:-verify)? [^`]+)`", (ROOT / path).read_text(encoding="utf-8"))
    return [c for c in found if "--help" not in c]


def _args(line: str) -> list[str]:
    """The arguments of a command line, placeholders (<run_id>, …) filled in."""
    return shlex.split(re.sub(r"<([^>]+)>", r"\1", line.replace("…", "x")))[1:]


def _parse(line: str, *, complete: bool = True) -> None:
    """Parse the command line as the CLI would, down to the last subcommand; raise on bad usage (a missing
    argument too, unless the line need not be `complete`)."""
    args = _args(line)
    if line.startswith("harness-verify"):
        if complete:
            verify_parser().parse_args(args)
        else:
            assert args[0] in ("export", "segment", "consistency"), line
        return
    try:
        _parse_cli(args)
    except click.MissingParameter:
        if complete:
            raise


def _parse_cli(args: list[str]) -> None:
    command: click.Command = typer.main.get_command(app)
    ctx = command.make_context("harness", args)
    while isinstance(command, click.Group):
        rest = [*ctx.protected_args, *ctx.args]
        if not rest:
            return
        name, sub, rest = command.resolve_command(ctx, rest)
        assert sub is not None and name is not None
        ctx = sub.make_context(name, rest, parent=ctx)
        command = sub


@pytest.mark.parametrize("path", DOCS)
def test_every_documented_command_parses(path: str) -> None:
    """Each documented command line is accepted by the CLI's parser as it is written."""
    bad = []
    lines = [(line, True) for line in doc_commands(path)] + [(line, False) for line in inline_commands(path)]
    for line, complete in lines:
        try:
            _parse(line, complete=complete)
        except (click.UsageError, click.BadParameter, SystemExit) as exc:
            bad.append(f"{line!r}: {exc}")
    assert not bad, f"{path}: commands the CLI refuses:\n" + "\n".join(bad)


def test_the_docs_show_commands() -> None:
    """The extraction finds the README's commands (the test above is not vacuous)."""
    assert len(doc_commands("README.md")) > 20
    assert any(c.startswith("harness --db") for d in DOCS for c in inline_commands(d))
