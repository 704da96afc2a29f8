"""Scale-out with Celery (SPEC D2, S1): workers drive Runs under leases; beat runs the sweeper.

Tasks carry only a run_id: everything else is in the database, so any worker can take any Run —
including a Run resumed after a human decision in another process (G6). Tasks are acknowledged late
and re-queued if a worker dies; the lease makes a second delivery harmless (only one worker drives a
Run at a time) and the sweep task re-queues Runs whose worker died without the broker noticing.

Broker: HARNESS_BROKER_URL (Redis or RabbitMQ), default redis://127.0.0.1:6379/0.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

from celery import Celery
from celery.signals import worker_process_init

from harness.audit.publisher import CheckpointPublisher
from harness.config import Runtime, Settings, archiver_factory, audit_reads, build_runtime
from harness.kernel import RunState
from harness.kernel.thresholds import SWEEP_INTERVAL_S
from harness.retention.policy import RetentionPolicy
from harness.retention.scheduled import archive_once
from harness.sweeper import ZombieSweeper
from harness.worker import RunWorker

log = logging.getLogger(__name__)
S = RunState


class _Process:
    """What this worker process holds: its runtime, built on first use (after the fork)."""

    runtime: Runtime | None = None
    lock = threading.Lock()


_process = _Process()


def runtime() -> Runtime:
    """This worker process's runtime, built on first use (after the fork)."""
    with _process.lock:
        if _process.runtime is None:
            _process.runtime = build_runtime(Settings.from_env())
            _process.runtime.runs.assembler.warm()
        return _process.runtime


@worker_process_init.connect
def _reset_after_fork(**_: Any) -> None:
    _process.runtime = None  # never share a parent's connections with a forked child


def orphans(rt: Runtime, grace_s: float, limit: int = 1000) -> list[str]:
    """Active Runs nobody holds a live lease on and that have not moved for `grace_s`: their worker died."""
    return rt.store.unowned_runs(grace_s, limit)


def make_app(broker: str | None = None) -> Celery:
    """The Celery application with the harness tasks and the sweep schedule."""
    app = Celery("harness", broker=broker or os.environ.get("HARNESS_BROKER_URL", "redis://127.0.0.1:6379/0"))
    settings = Settings.from_env()
    lease_ttl = settings.lease_ttl_s
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        broker_transport_options={"visibility_timeout": max(lease_ttl * 2, 30)},
        beat_schedule={"harness-sweep": {"task": "harness.sweep", "schedule": settings.sweep_interval_s},
                       # the webhook outbox (P4 / N1): leases keep two workers from sending one event at once
                       "harness-webhooks": {"task": "harness.webhooks.deliver",
                                            "schedule": float(os.environ.get("HARNESS_WEBHOOK_INTERVAL_S", "5"))}},
    )
    _schedule_checkpoints(app)
    _schedule_archive(app)

    @app.task(name="harness.drive")
    def drive(run_id: str) -> str | None:
        rt = runtime()
        result = RunWorker(rt, ttl_s=lease_ttl).execute(run_id, fresh=True)  # sent when it was accepted
        _prune_now_and_then(rt)
        return result.state if result else None

    @app.task(name="harness.sweep")
    def sweep() -> dict[str, int]:
        rt = runtime()
        report = ZombieSweeper(rt.store, rt.machine, thresholds=rt.settings.thresholds(),
                               expire_approvals=rt.runs.expire_approvals, resume=drive.delay,
                               resume_decisions=rt.runs.resume_decisions,
                               max_stalls=rt.settings.max_stalls).sweep_once()
        requeued = orphans(rt, grace_s=lease_ttl)
        for run_id in requeued:
            drive.delay(run_id)
        pruned = rt.runs.prune_workdirs()
        return {"recovered": len(report.recovered), "requeued": len(requeued), "resumed": len(report.resumed),
                "approvals_expired": len(report.approvals_expired), "workdirs_removed": len(pruned)}

    @app.task(name="harness.webhooks.deliver")
    def deliver_webhooks() -> dict[str, int]:
        dispatcher = runtime().dispatcher()
        try:
            report = dispatcher.deliver_all(max_passes=50)
        finally:
            dispatcher.close()
        return {"delivered": len(report.delivered), "retrying": len(report.retrying), "dead": len(report.dead)}

    return app


def _schedule_checkpoints(app: Celery) -> None:
    """Beat publishes a signed checkpoint every checkpoint_interval_s (SPEC A3b; 0: never): the task
    `harness.checkpoint`, which skips when another process published one within the interval."""
    interval = Settings.from_env().checkpoint_interval_s
    if interval > 0:
        app.conf.beat_schedule["harness-checkpoint"] = {"task": "harness.checkpoint", "schedule": interval}

    @app.task(name="harness.checkpoint")
    def checkpoint() -> dict[str, object]:
        rt = runtime()
        s = rt.settings
        published = CheckpointPublisher.from_settings(audit_reads(rt.store), s.checkpoint_interval_s,
                                                      s.checkpoint_dir, s.checkpoint_witnesses).publish_if_due()
        if published is None:
            return {"published": None}
        return {"published": str(published.path), "tree_size": published.tree_size,
                "witnesses": {name: error or "kept" for name, error in published.witnessed}}


def _schedule_archive(app: Celery) -> None:
    """Beat runs an archive pass every HARNESS_ARCHIVE_INTERVAL_S (0: never): the task `harness.archive`,
    which does nothing unless a retention period is set (HARNESS_RETENTION_DAYS / _TENANTS)."""
    interval = RetentionPolicy.from_env().interval_s
    if interval > 0:
        app.conf.beat_schedule["harness-archive"] = {"task": "harness.archive", "schedule": interval}

    @app.task(name="harness.archive")
    def archive() -> dict[str, object]:
        rt = runtime()
        report = archive_once(archiver_factory(rt.store, rt.settings.checkpoint_dir, rt.settings.checkpoint_witnesses))
        return {"archived": None} if report is None else report.to_dict()


app = make_app()


_last_prune = [0.0]


def _prune_now_and_then(rt: Runtime) -> None:
    """Every SWEEP_INTERVAL_S per worker process: remove the working directories on this host of Runs
    that a sweeper (or a worker elsewhere) closed, since no listener here saw those closes."""
    now = time.monotonic()
    if now - _last_prune[0] >= SWEEP_INTERVAL_S:
        _last_prune[0] = now
        rt.runs.prune_workdirs()


def submit(request: dict[str, Any], rt: Runtime | None = None) -> str:
    """Create the Run durably (CREATED) and queue it for a worker; returns the run_id."""
    rt = rt or runtime()
    run, created = rt.runs.submit(request)
    if created:
        app.send_task("harness.drive", args=[run.run_id])
    return run.run_id


def enqueue(run_id: str) -> None:
    """Queue an existing Run (e.g. resumed by a decision) for whichever worker is free."""
    app.send_task("harness.drive", args=[run_id])
