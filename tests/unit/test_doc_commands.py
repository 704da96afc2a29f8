"""Every `harness` and `harness-verify` command the README and the docs show is one the CLI accepts as
written: its subcommands exist, its options are known and its values convert (nothing is run)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer.main
from typer import BadParameter

# Typer ships its own click (typer._click, private): its commands, contexts and exceptions are not the `click`
# package's. Of these exceptions it re-exports only BadParameter (typer.BadParameter); the others, and the base
# class Command, live only in the private module.
from typer._click import Command
from typer._click.exceptions import BadOptionUsage, MissingParameter, NoSuchOption, UsageError
from typer.core import TyperGroup

from harness.audit.standalone import _parser as verify_parser
from harness.cli import app

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]
ENV_THEN_COMMAND = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(harness(?:-verify)?\s.*)$")


def doc_commands(path: str) -> list[str]:
    """The command lines of a document's code blocks: continued lines joined, comments cut, `&&`, `;`, pipes
    and a backgrounding `&` split, environment assignments before the command (`HARNESS_LLM=local harness
    run …`) dropped."""
    found, in_block = [], False
    for line in (ROOT / path).read_text(encoding="utf-8").replace("\\\n", " ").splitlines():
        if line.startswith("```"):
            in_block = not in_block
        elif in_block:
            parts = re.split(r"\s*(?:&&|\|\||[|;&])(?=\s|$)", line.split("  #")[0])
            found += [m.group(1) for p in parts if (m := re.match(ENV_THEN_COMMAND, p.strip()))]
    return [c for c in found if "--help" not in c]


def inline_commands(path: str) -> list[str]:
    """The commands a document's text names inline (`harness runs show RUN_ID`): often without the
    arguments a full line needs, so only their subcommands and options are checked."""
    found = re.findall(r"`(harness(?:-verify)? [^`]+)`", (ROOT / path).read_text(encoding="utf-8"))
    return [c for c in found if "--help" not in c]


def _args(line: str) -> list[str]:
    """The arguments of a command line, placeholders (<run_id>, …) filled in: the brackets of an optional
    option in a usage line (`[--dir FOLDER]`) dropped, its option still checked, and N, the placeholder of a
    number (`--processes N`), given one."""
    line = re.sub(r"\[(-[^]]*)\]", r"\1", re.sub(r"<([^>]+)>", r"\1", line.replace("…", "x")))
    return ["1" if arg == "N" else arg for arg in shlex.split(line)[1:]]


def _parse(line: str, *, complete: bool = True) -> None:
    """Parse the command line as the CLI would, down to the last subcommand; raise on bad usage (a missing
    argument, or a last option without its value, too, unless the line need not be `complete`)."""
    args = _args(line)
    if line.startswith("harness-verify"):
        if complete:
            verify_parser().parse_args(args)
        else:
            assert args[0] in ("export", "segment", "consistency"), line
        return
    try:
        _parse_cli(args)
    except MissingParameter:
        if complete:
            raise
    except BadOptionUsage as exc:  # named inline without its value (`harness serve --workers`): the option exists
        if complete or exc.option_name != args[-1]:
            raise


def _parse_cli(args: list[str]) -> None:
    command: Command = typer.main.get_command(app)
    ctx = command.make_context("harness", args)
    while isinstance(command, TyperGroup):
        rest = [*ctx._protected_args, *ctx.args]  # typer's Context has no public `protected_args`
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
        except (UsageError, BadParameter, SystemExit) as exc:
            bad.append(f"{line!r}: {exc}")
    assert not bad, f"{path}: commands the CLI refuses:\n" + "\n".join(bad)


def test_the_docs_show_commands() -> None:
    """The extraction finds the README's commands (the test above is not vacuous)."""
    assert len(doc_commands("README.md")) > 20
    assert any(c.startswith("harness --db") for d in DOCS for c in inline_commands(d))


def test_the_extraction_reads_shell_lines(tmp_path: Path) -> None:
    """Commands backgrounded, continued, chained or run with an environment are found, each one whole."""
    doc = tmp_path / "doc.md"
    doc.write_text("```\nharness worker --beat &           # worker + beat\nharness worker &\n"
                   "HARNESS_LLM=local A=1 harness run \"Where is it?\"  # note\nharness serve \\\n  --port 8000\n"
                   "harness approvals && harness approve R --as carol | jq .; harness-verify export x\n```\n",
                   encoding="utf-8")
    assert doc_commands(str(doc)) == ["harness worker --beat", "harness worker", 'harness run "Where is it?"',
                                      "harness serve    --port 8000", "harness approvals",
                                      "harness approve R --as carol", "harness-verify export x"]
    assert _args("harness audit move-key [--dir FOLDER]") == ["audit", "move-key", "--dir", "FOLDER"]
    assert _args("harness serve --processes N") == ["serve", "--processes", "1"]


@pytest.mark.parametrize("args", [
    ["no-such-command"],
    ["--no-such-option", "approvals"],
    ["approvals", "--no-such-option"],
    ["runs", "no-such-command"],
    ["runs", "show", "RUN_ID", "--no-such-option", "x"],
    ["runs", "show", "RUN_ID", "extra-argument"],
    ["audit", "rotate-key", "--dir", "keys", "--no-such-option"],
    ["audit", "verify", "--limit", "not-a-number"],
])
def test_the_parser_refuses_bad_commands(args: list[str]) -> None:
    """Every level is parsed (the test above is not vacuous): an unknown command or option, an extra argument
    or a value that does not convert is refused, at the top, in a group or in a nested command."""
    with pytest.raises(UsageError):
        _parse_cli(args)


def test_the_parser_accepts_nested_commands() -> None:
    """A nested command parses; one without its argument misses it (refused unless the line is inline)."""
    _parse_cli(["--db", "x.db", "runs", "show", "RUN_ID", "--json"])
    with pytest.raises(MissingParameter):
        _parse_cli(["runs", "show"])
    _parse("harness runs show", complete=False)
    with pytest.raises(NoSuchOption):
        _parse("harness runs show --no-such-option", complete=False)
