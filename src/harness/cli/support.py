"""What every CLI command shares: the --db option, JSON output and the exit-code contract (SPEC U1).

Exit codes: 0 success; 1 a check failed, or a decision, cancel or new Run was refused (it took no effect:
a new Run finding the queue full is told when to retry); 2 bad usage or bad input, reason on stderr, never
a traceback.
"""

from __future__ import annotations

import contextvars
import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, ParamSpec, TypeVar

import typer
from typer.core import TyperGroup

from harness.cli.startup import command_runs
from harness.domain.errors import (
    BacklogFullError,
    BadInputError,
    ConflictError,
    ForbiddenError,
    HarnessError,
    InvalidTransitionError,
)

if TYPE_CHECKING:
    from rich.console import Console

P = ParamSpec("P")
R = TypeVar("R")

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2

DbOption = Annotated[
    str | None,
    typer.Option("--db", envvar="HARNESS_DATABASE_URL", help="Database URL or SQLite file path.", show_envvar=True),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout.")]
AgentOption = Annotated[
    str | None,
    typer.Option("--agent", envvar="HARNESS_AGENT", show_envvar=True,
                 help="The agent: module:attr (an Agent in Python, importable from here) or an agent file; "
                      "default: the bundled support agent."),
]


#: the --agent given before the command, for this invocation (set by `root_options` every time)
_ROOT_AGENT: contextvars.ContextVar[str | None] = contextvars.ContextVar("harness_cli_agent", default=None)


RootDbOption = Annotated[str | None, typer.Option(
    "--db", help="Database URL or SQLite file path, for every command (a command's own --db wins).")]


def root_options(ctx: typer.Context, agent: AgentOption = None, db: RootDbOption = None) -> None:
    """Options of every command, given before it (`harness --agent helpdesk_agent:helpdesk approve ...`,
    `harness --db helpdesk.db runs show ID`); commands that build a runtime read the agent through
    `agent_reference`, and every command reads its --db from HARNESS_DATABASE_URL when not given one, so a
    --db before the command becomes that default (for this process and the ones it starts)."""
    command_runs()  # every command passes here first: the start's pause of the collector ends
    token = _ROOT_AGENT.set(agent or None)
    ctx.call_on_close(lambda: _ROOT_AGENT.reset(token))  # it names this command's agent, no later one's
    if db is not None:
        os.environ["HARNESS_DATABASE_URL"] = db


def agent_reference(agent: str | None = None) -> str | None:
    """The agent a command runs: its own --agent, else the one given before the command (or
    HARNESS_AGENT), else None (the settings decide: the bundled support agent)."""
    return agent or _ROOT_AGENT.get()


def check_agent(reference: str | Path | None) -> None:
    """Load the agent `reference` names, if any, so that a bad one is named now (BadInputError: exit 2),
    before the command touches the database or starts a process."""
    if reference:
        from harness.agents import load_agent

        load_agent(reference)


#: what no output of a command is wrapped at when it does not go to a terminal (a pipe, a file)
UNWRAPPED = 100_000


#: the top of `harness --help`: what it is, and who a command acts as when it names nobody
APP_HELP = """harness-kernel: governed, auditable, recoverable AI-agent Runs.

Who acts: `harness run` acts as default/alice (a support agent of the bundled example) unless --tenant and
--user name another identity of the identity directory (HARNESS_IDENTITIES); `harness cancel` acts as
default/operator unless --as names someone; `harness approve` and `harness reject` always need --as.

The database is --db (before or after the command) or HARNESS_DATABASE_URL, default ./harness.db."""


def make_app(group: type[TyperGroup]) -> typer.Typer:
    """The `harness` command group, of the click group class `group` (which knows its commands). On a
    terminal help is drawn in panels at its width; into a pipe or a file it is plain text that wraps nowhere
    (a path stays whole)."""
    terminal = sys.stdout.isatty()
    return typer.Typer(
        cls=group,
        help=APP_HELP,
        callback=root_options,
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
        rich_markup_mode="rich" if terminal else None,
        context_settings={} if terminal else {"terminal_width": UNWRAPPED, "max_content_width": UNWRAPPED},
    )


def screen() -> Console:
    """Where a command prints for people. On a terminal lines wrap at its width; into a pipe or a file
    nothing wraps (a suggested command stays on one line, a table keeps whole timestamps). Rich is imported
    here: a command printing JSON or failing never loads it."""
    from rich.console import Console

    if sys.stdout.isatty():
        return Console()
    return Console(width=UNWRAPPED, soft_wrap=True)


def emit(document: Any) -> None:
    """Print one JSON document on stdout, every time in it as ISO 8601 in UTC."""
    sys.stdout.write(json.dumps(iso_times(document), indent=2, sort_keys=True, default=str) + "\n")


def iso_times(document: Any) -> Any:
    """`document` with every time held as epoch seconds (a number under `at`, `timestamp` or a key ending in
    `_at`) written as ISO 8601 in UTC, however deep it sits."""
    from harness.timefmt import iso

    if isinstance(document, dict):
        return {k: iso(v) if _is_time(k, v) else iso_times(v) for k, v in document.items()}
    if isinstance(document, list | tuple):
        return [iso_times(v) for v in document]
    return document


def _is_time(key: object, value: object) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool) and isinstance(key, str)
            and (key in ("at", "timestamp") or key.endswith("_at")))


def identifier(flag: str) -> Callable[[str], str]:
    """A typer callback that refuses a tenant or user id no Run could have (blank, too long, odd characters)."""
    import re

    from harness.domain.contracts import IDENT

    def check(value: str) -> str:
        if value is not None and not re.fullmatch(IDENT, value):
            raise typer.BadParameter(f"{value!r} is not a valid id: 1 to 128 letters, digits or _.:@- "
                                     "starting with a letter or digit", param_hint=flag)
        return value
    return check


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print the reason on stderr and exit with `code`."""
    sys.stderr.write(f"error: {message}\n")
    raise typer.Exit(code)


def finite(flag: str) -> Callable[[float | None], float | None]:
    """The check of a number option that has no upper bound of its own: infinity and NaN are bad usage."""
    import math

    def check(value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise typer.BadParameter(f"{value:g} is not a finite number", param_hint=flag)
        return value

    return check


def seconds_up_to(most: float) -> Callable[[float | None], float | None]:
    """The check of an option in seconds (its typer `callback`): a number above 0 and at most `most` passes
    unchanged; anything else, infinity and NaN included, is bad usage (exit 2) naming the option, not an
    overflow where the number meets a clock, a timer or a date."""

    def check(value: float | None) -> float | None:
        if value is not None and not 0 < value <= most:  # not NaN either
            raise typer.BadParameter(f"{value:g} is not a number of seconds above 0 and at most {most:.10g}")
        return value

    return check


def cli_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """Turn library errors into the CLI's contract: a clear message on stderr and exit 2, no traceback."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return fn(*args, **kwargs)
        except (BadInputError, InvalidTransitionError) as exc:
            fail(str(exc))
        except ConflictError as exc:  # the command lost a race and changed nothing: refused, like a decision
            fail(str(exc), EXIT_CHECK_FAILED)
        except ForbiddenError as exc:  # the identity may not do this: refused, nothing changed
            fail(str(exc), EXIT_CHECK_FAILED)
        except BacklogFullError as exc:  # refused, nothing written; the message says when to retry
            fail(str(exc), EXIT_CHECK_FAILED)
        except HarnessError as exc:
            fail(f"{type(exc).__name__}: {exc}")
        except OSError as exc:
            fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
        except Exception as exc:
            if not is_database_error(exc):
                raise
            fail(f"database error: {exc.__class__.__name__}: {str(exc).splitlines()[0]}")

    return wrapper


def is_database_error(exc: BaseException) -> bool:
    """Whether `exc` is the store's database error, asked without loading the database layer: a command
    that never reached the composition root opened no database, so it cannot have raised one."""
    if "harness.stores" not in sys.modules:
        return False
    from harness.stores import DatabaseError

    return isinstance(exc, DatabaseError)
