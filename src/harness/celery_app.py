"""Scale-out with Celery (SPEC D2, S1): workers drive Runs under leases; beat runs the sweeper.

Tasks carry only a run_id: everything else is in the database, so any worker can take any Run —
including a Run resumed after a human decision in another process (G6). A worker process drives many
Runs at once: the `harness.drive` task hands its Run to the process's drive loop (greenlets on one
asyncio loop, harness.pipeline.drive_loop: a Run waiting for its model or a skill holds no thread) and
returns, and it waits for a place first while the process already drives HARNESS_DRIVE_CONCURRENCY
Runs, so a full worker takes no more messages. The message is acknowledged once the Run is handed over:
if the process then dies, its Runs' leases lapse and the sweep task re-queues them (as it re-queues
Runs whose worker died without the broker noticing); the lease makes a second delivery harmless (only
one worker drives a Run at a time).

Broker: HARNESS_BROKER_URL (Redis or RabbitMQ), default redis://127.0.0.1:6379/0.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.signals import after_setup_logger, worker_process_init, worker_process_shutdown, worker_shutting_down

from harness.audit.publisher import CheckpointPublisher
from harness.config import Runtime, build_runtime
from harness.domain.errors import DatabaseUnavailableError, InvalidRequestError, SkillsElsewhereError
from harness.domain.ids import ordered_id
from harness.drive.sweeper import ZombieSweeper
from harness.drive.worker import RunWorker
from harness.kernel.states import RunState
from harness.pipeline.drive_loop import DriveLoop
from harness.retention.policy import RetentionPolicy
from harness.retention.scheduled import archive_once
from harness.service.logs import routine_logs_at_debug
from harness.settings import Settings
from harness.stores import audit_reads, is_outage
from harness.wiring.retention import archiver_factory
from harness.wiring.signer import checkpoint_signer

log = logging.getLogger(__name__)
S = RunState


class _Process:
    """What this worker process holds: its runtime and its drives, made on first use (after the fork)."""

    runtime: Runtime | None = None
    drives: ProcessDrives | None = None
    lock = threading.Lock()


class ProcessDrives:
    """The Runs one worker process drives at once, on its drive loop."""

    def __init__(self, concurrency: int, threads: int = 1, max_lag_s: float = 0.5) -> None:
        self.concurrency = concurrency
        self.loop = DriveLoop(concurrency=concurrency, threads=threads, max_lag_s=max_lag_s, name="harness-drives")
        self._places = threading.BoundedSemaphore(concurrency)
        self._lock = threading.Lock()
        self._driving: set[str] = set()

    @property
    def driving(self) -> int:
        """Runs handed over and not yet done."""
        return len(self._driving)

    def hand_over(self, run_id: str, drive: Callable[[], object]) -> str:
        """Start `drive` for the Run on the loop once there is a place ("driving"), or "already" when this
        process drives the Run now (a second delivery)."""
        with self._lock:
            if run_id in self._driving:
                return "already"
            self._driving.add(run_id)
        self._places.acquire()  # a full process waits here, and its worker takes no further message

        def done() -> None:
            with self._lock:
                self._driving.discard(run_id)
            self._places.release()

        def run() -> None:
            try:
                drive()
            except SkillsElsewhereError as exc:  # another agent's Run: left for a worker that runs it
                log.warning(str(exc), extra={"run_id": run_id})
            except Exception:  # one Run's failure must not end the worker; its lease lapses, the sweep resumes it
                log.exception("driving the run failed", extra={"run_id": run_id})
            finally:
                done()

        # a drive the stopping loop never starts leaves its Run unowned: the orphan sweep sends it again
        try:
            self.loop.submit(run, not_started=done)
        except RuntimeError:  # the process is stopping: the same
            done()
            raise
        return "driving"

    def stop(self, timeout_s: float) -> None:
        """Let the Runs in flight reach their next stop for up to `timeout_s`, then stop."""
        self.loop.stop(timeout_s)


_process = _Process()


def drives(rt: Runtime) -> ProcessDrives:
    """This worker process's drives (made on first use, after the fork)."""
    with _process.lock:
        if _process.drives is None:
            _process.drives = ProcessDrives(rt.settings.drive_concurrency, rt.settings.drive_loop_threads(),
                                            rt.settings.drive_max_lag_s)
        return _process.drives


def runtime() -> Runtime:
    """This worker process's runtime, built on first use (after the fork)."""
    with _process.lock:
        if _process.runtime is None:
            _process.runtime = build_runtime(Settings.from_env())
            _process.runtime.runs.assembler.warm()
        return _process.runtime


@after_setup_logger.connect
def _routine_at_debug(loglevel: int | None = None, **_: Any) -> None:
    """As in `harness serve`: the HTTP clients' line for every request, and the like, only at DEBUG."""
    routine_logs_at_debug(logging.INFO if loglevel is None else loglevel)


@worker_process_init.connect
def _reset_after_fork(**_: Any) -> None:
    _process.runtime = None  # never share a parent's connections with a forked child
    _process.drives = None


@worker_shutting_down.connect
@worker_process_shutdown.connect
def _stop_driving(**_: Any) -> None:
    """A worker asked to stop lets its Runs reach their next stop (then gives their leases back)."""
    if _process.drives is not None:
        _process.drives.stop(10.0)


def orphans(rt: Runtime, grace_s: float, limit: int = 1000) -> list[str]:
    """Active Runs nobody holds a live lease on and that have not moved for `grace_s`: their worker died."""
    return rt.store.unowned_runs(grace_s, limit)


def broker_url(broker: str | None = None) -> str:
    """The broker URL: `broker`, else HARNESS_BROKER_URL, else the local Redis."""
    return broker or os.environ.get("HARNESS_BROKER_URL", "redis://127.0.0.1:6379/0")


def check_broker(broker: str | None = None) -> None:
    """Refuse (InvalidRequestError, naming the URL without its password) a broker URL Celery could not
    connect with at all: an unknown transport, a transport whose client library is missing, a URL that does
    not parse, a Redis database that is not a number. Nothing is connected to: a broker that is down is the
    worker's to wait for."""
    _check_broker_url(broker_url(broker))


@functools.cache
def _check_broker_url(url: str) -> None:
    """check_broker for one URL, once per process (submit checks its app's broker before every Run)."""
    from kombu.connection import Connection

    shown = re.sub(r"(://[^:/@]*:)[^@/]*@", r"\1**@", url)
    try:
        connection = Connection(url)  # type: ignore[no-untyped-call]  # kombu leaves it unannotated
        connection.transport  # noqa: B018 (resolves the transport, importing its client library)
    except KeyError:
        raise InvalidRequestError(f"broker {shown}: no such transport {url.partition(':')[0]!r} (Redis: "
                                  "redis://host:6379/0, RabbitMQ: amqp://user:password@host:5672//)") from None
    except ImportError as exc:
        raise InvalidRequestError(f"broker {shown}: its transport needs {exc.name}, which is not installed") \
            from None
    except ValueError as exc:
        raise InvalidRequestError(f"broker {shown}: not a broker URL: {exc}") from None
    database = (connection.virtual_host or "/").removeprefix("/")
    if connection.transport_cls in ("redis", "rediss") and database and not database.isdigit():
        raise InvalidRequestError(f"broker {shown}: the Redis database is a number, not {database!r}")


def make_app(broker: str | None = None) -> Celery:
    """The Celery application with the harness tasks and the sweep schedule.

    Each app's tasks are its own (`shared=False`): Celery's default shares a decorated task with every app
    finalized later, so a second app (`harness worker` makes one beside the module's) would run the first
    app's tasks, bound to the first app's broker, under the same names."""
    app = Celery("harness", broker=broker_url(broker))
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

    @app.task(name="harness.drive", shared=False)
    def drive(run_id: str) -> str:
        rt = runtime()
        handed = drives(rt).hand_over(  # sent when it was accepted: most likely still in CREATED
            run_id, lambda: RunWorker(rt, ttl_s=lease_ttl).execute(run_id, fresh=True))
        _prune_now_and_then(rt)
        return handed

    @app.task(name="harness.sweep", shared=False)
    def sweep() -> dict[str, int]:
        rt = runtime()
        report = ZombieSweeper(rt.store, rt.machine, thresholds=rt.settings.thresholds(),
                               expire_approvals=rt.runs.expire_approvals, resume=drive.delay,
                               resume_decisions=rt.runs.resume_decisions,
                               max_stalls=rt.settings.max_stalls).sweep_once()
        handed_back = set(report.requeued)  # queued Runs the sweep just sent: one message each, not two
        requeued = [r for r in orphans(rt, grace_s=lease_ttl) if r not in handed_back]
        for run_id in requeued:
            drive.delay(run_id)
        pruned = rt.runs.prune_workdirs()
        return {"recovered": len(report.recovered), "requeued": len(requeued), "resumed": len(report.resumed),
                "queued_requeued": len(report.requeued), "not_started": len(report.not_started),
                "approvals_expired": len(report.approvals_expired), "workdirs_removed": len(pruned)}

    @app.task(name="harness.webhooks.deliver", shared=False)
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

    @app.task(name="harness.checkpoint", shared=False)
    def checkpoint() -> dict[str, object]:
        rt = runtime()
        s = rt.settings
        published = CheckpointPublisher.from_settings(audit_reads(rt.store), s.checkpoint_interval_s,
                                                      s.checkpoint_dir, s.checkpoint_witnesses,
                                                      signer=checkpoint_signer(s),
                                                      rule=s.witness_rule()).publish_if_due()
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

    @app.task(name="harness.archive", shared=False)
    def archive() -> dict[str, object]:
        rt = runtime()
        report = archive_once(archiver_factory(rt.store, rt.settings.checkpoint_dir, rt.settings.checkpoint_witnesses,
                                               checkpoint_signer(rt.settings), rt.settings.witness_rule()))
        return {"archived": None} if report is None else report.to_dict()


app = make_app()


_last_prune = [0.0]


def _prune_now_and_then(rt: Runtime) -> None:
    """Every sweep interval (the settings') per worker process: remove the working directories on this host
    of Runs that a sweeper (or a worker elsewhere) closed, since no listener here saw those closes."""
    now = time.monotonic()
    if now - _last_prune[0] >= rt.settings.sweep_interval_s:
        _last_prune[0] = now
        rt.runs.prune_workdirs()


#: how many times submit() tries when the database drops its connection, and the first pause between
#: tries (doubling): about 3 s in all, a failover's usual length
SUBMIT_ATTEMPTS = 6
SUBMIT_RETRY_S = 0.1


def submit(request: dict[str, Any], rt: Runtime | None = None) -> str:
    """Create the Run durably (CREATED) and queue it for a worker; returns the run_id.

    A connection the database drops or refuses (a failover, a restart, a terminated session) is tried
    again. That is safe because the request carries an idempotency key (the caller's, else one made
    here for this call): a try whose Run was committed before its connection broke finds that Run, so no
    Run is made twice, and a Run found still CREATED is queued. A database unavailable on every try
    raises DatabaseUnavailableError; the same request, with its key, may be sent again later. A broker URL
    Celery cannot use at all raises InvalidRequestError before anything is written (check_broker)."""
    check_broker(app.conf.broker_url)  # a broker Celery cannot use: refused before the Run is made
    rt = rt or runtime()
    request = {**request, "idempotency_key": request.get("idempotency_key") or f"submit-{ordered_id()}"}
    for attempt in range(SUBMIT_ATTEMPTS):
        try:
            run, created = rt.runs.submit(request)
        except Exception as exc:
            if not is_outage(exc):
                raise
            if attempt == SUBMIT_ATTEMPTS - 1:
                raise DatabaseUnavailableError(f"the database was unavailable on {SUBMIT_ATTEMPTS} tries to submit "
                                               f"the Run: {type(exc).__name__}") from exc
            log.warning("submit: the database is unavailable (%s); trying again", type(exc).__name__)
            time.sleep(SUBMIT_RETRY_S * 2**attempt)
            continue
        if created or (attempt > 0 and run.state is RunState.CREATED):
            app.send_task("harness.drive", args=[run.run_id])
        return run.run_id
    raise AssertionError("unreachable: the last try returns or raises")


def enqueue(run_id: str) -> None:
    """Queue an existing Run (e.g. resumed by a decision) for whichever worker is free."""
    check_broker(app.conf.broker_url)
    app.send_task("harness.drive", args=[run_id])
