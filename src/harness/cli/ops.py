"""`harness sweep` and `harness worker`: the sweeper and the scale-out worker as commands (SPEC S1, D2, U1)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Annotated

import typer

from harness.cli.runs import operations
from harness.cli.startup import kept_until_exit
from harness.cli.support import (
    AgentOption,
    DbOption,
    JsonOption,
    agent_reference,
    check_agent,
    emit,
    seconds_up_to,
)
from harness.kernel.thresholds import MAX_DURATION_S

if TYPE_CHECKING:
    from celery import Celery

    from harness.drive.sweeper import SweepReport


def _doc(report: SweepReport) -> dict[str, object]:
    return {"detected": report.detected, "recovered": report.recovered, "lost": report.lost,
            "healthy": report.healthy, "resumed": report.resumed, "approvals_expired": report.approvals_expired,
            "decisions_resumed": report.decisions_resumed, "requeued": report.requeued, "queued": report.queued,
            "not_started": report.not_started}


def sweep(
    once: Annotated[bool, typer.Option("--once/--forever", help="One pass, or keep sweeping.")] = True,
    interval: Annotated[float | None, typer.Option(
        "--interval", callback=seconds_up_to(MAX_DURATION_S),
        help="Seconds between passes, above 0 and at most 366 days (default: the sweep interval setting).")] = None,
    resume: Annotated[bool, typer.Option(
        "--resume/--no-resume",
        help="Drive stuck Runs that can still be resumed here, instead of closing them (off: this command "
             "is the backstop that closes what no worker picked up; queued Runs, never started, are left "
             "queued for a worker).")] = False,
    db: DbOption = None,
    json_: JsonOption = False,
) -> None:
    """Find Runs stuck past their state's threshold and close (or resume) them; close queued Runs past their
    start deadline (never a queued Run for waiting); expire overdue approvals; carry out decided approvals
    whose Run did not move."""
    ops = operations(db)
    sweeper = ops.sweeper(resume=resume)
    interval = interval if interval is not None else ops.settings.sweep_interval_s
    if not once:
        typer.echo(f"sweeping every {interval:g}s; Ctrl-C to stop", err=True)
        try:
            sweeper.run_forever(interval, threading.Event())
        except KeyboardInterrupt:
            return
    report = sweeper.sweep_once()
    pruned = ops.prune_workdirs()  # this host's directories of Runs closed by any process
    if json_:
        emit({**_doc(report), "workdirs_removed": pruned})
    else:
        typer.echo(f"detected {len(report.detected)}, recovered {len(report.recovered)}, lost to another writer "
                   f"{len(report.lost)}, healthy (heartbeating) {len(report.healthy)}, resumed "
                   f"{len(report.resumed)}, queued (not started) {len(report.queued) + len(report.requeued)}, "
                   f"closed past their start deadline {len(report.not_started)}, approvals expired "
                   f"{len(report.approvals_expired)}, decided approvals carried out {len(report.decisions_resumed)}, "
                   f"working directories removed {len(pruned)}")


def worker(
    concurrency: Annotated[int | None, typer.Option(
        "--concurrency", "-c", min=1, max=100_000,
        help="Runs this process drives at once; a waiting Run holds no thread (HARNESS_DRIVE_CONCURRENCY, "
             "default 1000).")] = None,
    beat: Annotated[bool, typer.Option("--beat", help="Also run Celery beat here (the periodic sweep).")] = False,
    broker: Annotated[str | None, typer.Option("--broker", envvar="HARNESS_BROKER_URL",
                                                help="Celery broker URL (Redis or RabbitMQ).")] = None,
    db: DbOption = None,
    agent: AgentOption = None,
) -> None:
    """Run a Celery worker that drives Runs from the queue (scale-out); --beat adds the sweep schedule.

    One process drives many Runs at once on its drive loop; run more processes (on more machines) to
    use more cores."""
    import os

    if db:
        os.environ["HARNESS_DATABASE_URL"] = db
    if broker:
        os.environ["HARNESS_BROKER_URL"] = broker
    if concurrency is not None:
        os.environ["HARNESS_DRIVE_CONCURRENCY"] = str(concurrency)
    # the start (the agent, the broker URL, the schema, Celery's app) runs with the collector paused, and what it
    # built is frozen before Celery starts (harness.cli.startup)
    with kept_until_exit():
        app = _started(db, broker, agent_reference(agent))
    # two task threads hand Runs over to the drive loop (one may wait for a place while the other takes the
    # next message); the Runs themselves are driven on the loop, not on these threads
    argv = ["worker", "--pool=threads", "--concurrency=2", "--loglevel=INFO", "--without-gossip",
            "--without-mingle"]
    if beat:
        argv.append("--beat")
    app.worker_main(argv)


def _started(db: str | None, broker: str | None, reference: str | None) -> Celery:
    """The worker's Celery app, once its agent, its broker URL and its database are checked."""
    import logging
    import os

    check_agent(reference)  # named now, not in the worker's first task
    from harness.celery_app import check_broker, make_app
    from harness.stores import prepare_schema

    check_broker(broker)  # a URL Celery cannot use is one line here, not a traceback as Celery starts
    if reference:
        os.environ["HARNESS_AGENT"] = reference
    # as `harness serve`: the database reached and its schema made current before Celery starts (a bad
    # database is one error here, not a failure of the worker's first task). Celery sets up the log only as
    # it starts, so the migration's lines (`Running upgrade …`) go to stderr through a handler of their own
    root, lines = logging.getLogger(), logging.StreamHandler()
    lines.setFormatter(logging.Formatter("[%(asctime)s: %(levelname)s/MainProcess] %(message)s"))
    level = root.level
    root.addHandler(lines)
    if root.getEffectiveLevel() > logging.INFO:
        root.setLevel(logging.INFO)
    try:
        prepare_schema(db)
    finally:
        root.removeHandler(lines)
        root.setLevel(level)
    return make_app(broker)
