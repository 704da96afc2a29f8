"""What every CLI command shares: the --db option, JSON output and the exit-code contract (SPEC U1).

Exit codes: 0 success; 1 a check failed, or a decision or cancel was refused (it took no effect); 2 bad
usage or bad input, reason on stderr, never a traceback.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Annotated, Any, NoReturn, ParamSpec, TypeVar

import typer
from rich.console import Console

from harness.config import DatabaseError
from harness.domain.errors import BadInputError, ConflictError, HarnessError, InvalidTransitionError

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


def make_app() -> typer.Typer:
    """The `harness` command group, before its commands are added."""
    return typer.Typer(
        help="harness-kernel: governed, auditable, recoverable AI-agent Runs.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )


def screen() -> Console:
    """Where a command prints for people. On a terminal lines wrap at its width; into a pipe or a file
    nothing wraps (a suggested command stays on one line, a table keeps whole timestamps)."""
    if sys.stdout.isatty():
        return Console()
    return Console(width=100_000, soft_wrap=True)


def emit(document: Any) -> None:
    """Print one JSON document on stdout."""
    sys.stdout.write(json.dumps(document, indent=2, sort_keys=True, default=str) + "\n")


def fail(message: str, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print the reason on stderr and exit with `code`."""
    sys.stderr.write(f"error: {message}\n")
    raise typer.Exit(code)


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
        except HarnessError as exc:
            fail(f"{type(exc).__name__}: {exc}")
        except OSError as exc:
            fail(f"{exc.strerror or exc}: {exc.filename or ''}".rstrip(": "))
        except DatabaseError as exc:
            fail(f"database error: {exc.__class__.__name__}: {str(exc).splitlines()[0]}")

    return wrapper
