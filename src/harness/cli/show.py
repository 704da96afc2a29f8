"""`harness runs show`: a Run's state, path of transitions, legacy job status and cost."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

import typer

from harness.cli import archive as cli_archive
from harness.cli.support import DbOption, JsonOption, cli_errors, emit, screen

runs_app = typer.Typer(help="Inspect Runs.", no_args_is_help=True)


def _ts(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="milliseconds")


@runs_app.command("show")
@cli_errors
def runs_show(
    run_id: Annotated[str, typer.Argument(help="The Run's id.")],
    db: DbOption = None,
    json_: JsonOption = False,
    from_archive: Annotated[bool, typer.Option(
        "--from-archive", help="For an archived Run: read it back from its segment (checked first).")] = False,
    checkpoint_dir: cli_archive.CheckpointDirOption = None,
    s3_endpoint: cli_archive.EndpointOption = None,
) -> None:
    """Show a Run: state, the path of transitions with timestamps, and the legacy job status; for an
    archived Run, where it is (and, with --from-archive, what it held)."""
    from harness.cli.documents import run_document
    from harness.stores import open_store

    store = open_store(db)
    archived = cli_archive.archived_or_none(store, run_id)
    if archived is not None:
        cli_archive.show_archived(store, archived, json_=json_, from_archive=from_archive,
                                  checkpoint_dir_=checkpoint_dir, endpoint=s3_endpoint)
        return
    doc = run_document(store, run_id)
    if json_:
        emit(doc)
        return
    console = screen()
    console.print(f"[bold]Run {doc['run_id']}[/]  state [bold]{doc['state']}[/]  legacy status {doc['legacy_status']}")
    from rich.table import Table

    table = Table("#", "from", "to", "at", "by", "reason")
    for t in doc["transitions"]:
        table.add_row(str(t["seq"]), t["from"] or "", t["to"], _ts(t["at"]), t["actor"], t["reason"])
    console.print(table)
    cost = doc["cost"]
    console.print(f"cost: {cost['usd']:.6f} USD · {cost['input_tokens']} tokens in, {cost['output_tokens']} out · "
                  f"{cost['api_calls']} API calls · {cost['sandbox_s']:.2f} sandbox s · {cost['costs']} costs"
                  + (f" incl. {cost['children']} child Run(s)" if cost["children"] else ""))
