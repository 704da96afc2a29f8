"""`harness replay RUN_ID`: re-execute a finished Run from its recording and report divergence (SPEC A5, U1).

Exit codes follow U1: 0 the replay did what the Run did; 1 it diverged (a check failed); 2 the Run
cannot be replayed (unknown, not finished, recorded without contents) or the input is bad. The source
database is only read: the replay runs on a temporary database of its own.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from harness.cli.support import EXIT_CHECK_FAILED, DbOption, JsonOption, agent_reference, emit, screen
from harness.domain.errors import InvalidRequestError

if TYPE_CHECKING:
    from harness.replay.facts import ReplayReport


def replay(
    run_id: Annotated[str, typer.Argument(help="The finished Run to replay.")],
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Re-execute a finished Run with its recorded LLM answers and tool results; report any divergence."""
    if db and "://" not in db and not Path(db).expanduser().exists():
        raise InvalidRequestError(f"no database at {db!r}")
    from harness.replay.runner import replay as replay_run
    from harness.settings import Settings
    from harness.stores import open_store

    source = open_store(db, migrate_schema=False)  # replay never writes to the Run's database
    try:
        report = replay_run(run_id, source, Settings.from_env(agent=agent_reference()))
    finally:
        source.close()
    if json_:
        emit(report.to_dict())
    else:
        show(report)
    if not report.ok:
        raise typer.Exit(EXIT_CHECK_FAILED)


def show(report: ReplayReport) -> None:
    """Human-readable report."""
    console = screen()
    console.print(f"[bold]replay of run[/] {report.run_id}  (scratch run {report.replay_run_id})")
    console.print("  path: " + " → ".join(report.summary.get("path", [])))
    if report.ok:
        console.print("  [green]no divergence[/]: same plan, verdicts, tool calls, path and result")
        return
    first = report.divergences[0]
    console.print(f"  [red]diverged[/] first at {first.check} / {first.where}: {first.detail}")
    for d in report.divergences:
        console.print(f"  - {d.check} / {d.where}")
        console.print(f"      recorded: {d.expected!r:.200}\n      replayed: {d.actual!r:.200}")
