"""The `harness` command line: a thin shell over the library (SPEC U1)."""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any

import typer
from rich.table import Table

from harness import cli_archive, cli_ops, cli_replay, cli_runs, cli_serve, cli_webhooks
from harness.adapters.sql.ledger import CostLedger
from harness.cli_audit import audit_app
from harness.cli_skills import skills_app
from harness.cli_support import DbOption, JsonOption, cli_errors, emit, open_store, screen
from harness.cli_witness import witness_app

app = typer.Typer(
    help="harness-kernel: governed, auditable, recoverable AI-agent Runs.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
runs_app = typer.Typer(help="Inspect Runs.", no_args_is_help=True)
app.add_typer(runs_app, name="runs")
app.add_typer(audit_app, name="audit")
app.add_typer(cli_webhooks.webhooks_app, name="webhooks")
app.command("costs")(cli_webhooks.costs)
app.add_typer(witness_app, name="witness")
app.add_typer(skills_app, name="skills")
for _name, _fn in (("run", cli_runs.run), ("trace", cli_runs.trace), ("cancel", cli_runs.cancel),
                   ("approve", cli_runs.approve), ("reject", cli_runs.reject), ("approvals", cli_runs.approvals),
                   ("demo", cli_runs.demo), ("sweep", cli_ops.sweep), ("serve", cli_serve.serve),
                   ("replay", cli_replay.replay), ("worker", cli_ops.worker), ("archive", cli_archive.archive),
                   ("erase", cli_archive.erase)):
    app.command(_name)(cli_errors(_fn))


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
    cost = CostLedger(store).run_total(run_id).to_dict()
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


def main() -> None:
    """Entry point of the `harness` script."""
    app()


if __name__ == "__main__":
    main()
