"""`harness sweep` and `harness worker`: the sweeper and the scale-out worker as commands (SPEC S1, D2, U1)."""

from __future__ import annotations

import threading
from typing import Annotated

import typer

from harness.cli_runs import runtime
from harness.cli_support import DbOption, JsonOption, emit
from harness.kernel.thresholds import SWEEP_INTERVAL_S
from harness.sweeper import SweepReport, ZombieSweeper


def _doc(report: SweepReport) -> dict[str, object]:
    return {"detected": report.detected, "recovered": report.recovered, "lost": report.lost,
            "healthy": report.healthy, "approvals_expired": report.approvals_expired}


def sweep(
    once: Annotated[bool, typer.Option("--once/--forever", help="One pass, or keep sweeping.")] = True,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between passes.")] = SWEEP_INTERVAL_S,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Find Runs stuck past their state's threshold and close them; expire overdue approvals."""
    rt = runtime(db)
    sweeper = ZombieSweeper(rt.store, rt.machine, expire_approvals=rt.runs.expire_approvals)
    if not once:
        typer.echo(f"sweeping every {interval:g}s; Ctrl-C to stop", err=True)
        try:
            sweeper.run_forever(interval, threading.Event())
        except KeyboardInterrupt:
            return
    report = sweeper.sweep_once()
    pruned = rt.runs.prune_workdirs()  # this host's directories of Runs closed by any process
    if json_:
        emit({**_doc(report), "workdirs_removed": pruned})
    else:
        typer.echo(f"detected {len(report.detected)}, recovered {len(report.recovered)}, lost to another writer "
                   f"{len(report.lost)}, healthy (heartbeating) {len(report.healthy)}, approvals expired "
                   f"{len(report.approvals_expired)}, working directories removed {len(pruned)}")


def worker(
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", help="Runs driven at once.")] = 2,
    beat: Annotated[bool, typer.Option("--beat", help="Also run Celery beat here (the periodic sweep).")] = False,
    broker: Annotated[str | None, typer.Option("--broker", envvar="HARNESS_BROKER_URL",
                                                help="Celery broker URL (Redis or RabbitMQ).")] = None,
    db: DbOption = None,
) -> None:
    """Run a Celery worker that drives Runs from the queue (SPEC D2); --beat adds the sweep schedule."""
    import os

    if db:
        os.environ["HARNESS_DATABASE_URL"] = db
    if broker:
        os.environ["HARNESS_BROKER_URL"] = broker
    from harness.celery_app import make_app

    app = make_app(broker)
    argv = ["worker", f"--concurrency={concurrency}", "--loglevel=INFO", "--without-gossip", "--without-mingle"]
    if beat:
        argv.append("--beat")
    app.worker_main(argv)
