"""`harness runs show`: a Run's state, path of transitions, legacy job status and cost."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

import typer
from rich.table import Table

from harness.cli import archive as cli_archive
from harness.cli.support import DbOption, JsonOption, cli_errors, emit, screen
from harness.config import cost_ledger, open_store

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
    store = open_store(db)
    archived = cli_archive.archived_or_none(store, run_id)
    if archived is not None:
        cli_archive.show_archived(store, archived, json_=json_, from_archive=from_archive,
                                  checkpoint_dir_=checkpoint_dir, endpoint=s3_endpoint)
        return
    run = store.get_run(run_id)
    path = store.transitions_of(run_id)
    status, snapshot = store.legacy_job(run_id)
    cost = cost_ledger(store).run_total(run_id).to_dict()
    doc: dict[str, Any] = {
        "run_id": run.run_id,
        "state": run.state.value,
        "close_reason": run.close_reason.value if run.close_reason else None,
        "tenant_id": run.tenant_id,
        "user_id": run.user_id,
        "session_id": run.session_id,
        "retry_of": run.retry_of,
        "created_at": _ts(run.created_at),
        "last_state_change_at": _ts(run.last_state_change_at),
        "path": [t.to_state.value for t in path],
        "transitions": [
            {"seq": t.seq, "from": t.from_state.value if t.from_state else None, "to": t.to_state.value,
             "at": _ts(t.at), "actor": t.actor, "reason": t.reason, "forced_by": t.forced_by}
            for t in path
        ],
        "legacy_job": {"status": status, "run_state_snapshot": snapshot},
        "result": run.result,
        "cost": cost,
    }
    if json_:
        emit(doc)
        return
    console = screen()
    console.print(f"[bold]Run {run.run_id}[/]  state [bold]{run.state.value}[/]  legacy status {status}")
    table = Table("#", "from", "to", "at", "by", "reason")
    for t in path:
        table.add_row(str(t.seq), t.from_state.value if t.from_state else "", t.to_state.value, _ts(t.at),
                      t.actor, t.reason)
    console.print(table)
    console.print(f"cost: {cost['usd']:.6f} USD · {cost['input_tokens']} tokens in, {cost['output_tokens']} out · "
                  f"{cost['api_calls']} API calls · {cost['sandbox_s']:.2f} sandbox s · {cost['costs']} costs"
                  + (f" incl. {cost['children']} child Run(s)" if cost["children"] else ""))
