"""The HTTP service (SPEC U2-U4): a thin shell over the library's operator API (harness.operations).

`create_app()` builds the service around a Runtime (the composition root in harness.config): the routes and
the console and the metrics reach it only through `Operations`; the embedded worker (the drive machinery) and
the spans are wired on the runtime itself, with live updates and structured request logs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import metadata
from pathlib import Path
from typing import Any

import anyio.to_thread
from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from harness.config import Runtime, build_runtime
from harness.kernel.states import RunState
from harness.operations import Operations
from harness.policy.identity import IdentityDirectory
from harness.service import entrances, errors
from harness.service.auth import Authenticator, SessionSigner
from harness.service.body_limit import BodyLimit, NulGuard
from harness.service.core import Service
from harness.service.metrics import Metrics
from harness.service.routes import approvals, console, console_more, costs, files, kb, ops, runs, webhooks
from harness.service.settings import ServiceSettings
from harness.service.sse import ChangeHub
from harness.service.telemetry import Telemetry
from harness.service.worker import EmbeddedWorker
from harness.settings import Settings
from harness.webhooks.delivery import DeliveryThread

STATIC_DIR = Path(__file__).resolve().parent / "console" / "static"
log = logging.getLogger("harness.service")
transitions_log = logging.getLogger("harness.transitions")

DESCRIPTION = """Executes AI-agent Runs as governed, auditable, recoverable units of work.

Authenticate every request with `Authorization: Bearer <API key>` or `X-API-Key: <API key>`.
Everything you see and decide is scoped to your credential's tenant; another tenant's ids are 404.
"""


def _version() -> str:
    try:
        return metadata.version("harness-kernel")
    except metadata.PackageNotFoundError:
        return "0+unknown"


class RequestLog:
    """ASGI middleware: one structured log line and one histogram sample per HTTP request."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Time the request and record its status."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def capture(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, capture)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            elapsed = time.perf_counter() - started
            self.metrics.requests.labels(scope["method"], route, str(status)).observe(elapsed)
            log.info(
                "request",
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "route": route,
                    "status": status,
                    "duration_ms": round(elapsed * 1000, 2),
                    "run_id": (scope.get("path_params") or {}).get("run_id"),
                },
            )


def _log_transition(run_id: str, source: RunState, target: RunState) -> None:
    transitions_log.info("state changed", extra={"run_id": run_id, "from": source.value, "to": target.value})


def build_service(
    runtime: Runtime | None = None,
    settings: ServiceSettings | None = None,
    *,
    telemetry: Telemetry | None = None,
    runtime_settings: Settings | None = None,
) -> Service:
    """The service's parts around a Runtime (built from `runtime_settings`, or the environment, when not
    given: the context's vocabulary is loaded then, before the first Run)."""
    settings = settings or ServiceSettings.from_env()
    owns = runtime is None
    if runtime is None:
        runtime = build_runtime(runtime_settings or Settings.from_env())
        runtime.runs.assembler.warm()
    telemetry = telemetry or Telemetry.from_setting(settings.otel_exporter)
    directory: IdentityDirectory = runtime.identities
    ops = Operations(runtime)
    svc = Service(
        ops=ops,
        settings=settings,
        auth=Authenticator(directory, SessionSigner(settings.session_secret, settings.session_ttl_s)),
        worker=EmbeddedWorker(
            runtime,
            concurrency=settings.concurrency or runtime.settings.drive_concurrency,
            queue_limit=settings.queue_limit,
            housekeeping_interval_s=settings.housekeeping_interval_s,
        ),
        hub=ChangeHub(runtime.feed),
        metrics=Metrics(ops, runtime.settings.thresholds(), runtime.settings.pool_settings()),
        telemetry=telemetry,
        owns_runtime=owns,
        deliveries=DeliveryThread(runtime.dispatcher(), settings.webhook_interval_s)
        if settings.webhook_interval_s > 0 and runtime.webhook_outbox is not None else None,
    )
    svc.metrics.watch_drives(svc.worker, runtime.runs.tools.lanes.all())
    for listener in (svc.metrics.on_transition, _log_transition):
        runtime.machine.subscribe(listener)
    if telemetry is not None:
        telemetry.instrument(runtime)
    return svc


def create_app(
    runtime: Runtime | None = None,
    settings: ServiceSettings | None = None,
    *,
    telemetry: Telemetry | None = None,
    runtime_settings: Settings | None = None,
) -> FastAPI:
    """The ASGI app: API under /api/v1, legacy /jobs, /health, /metrics, and the console under /ui."""
    svc = build_service(runtime, settings, telemetry=telemetry, runtime_settings=runtime_settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # the request handlers that block (database reads and writes) share this many threads, so that
        # with the drive loop, the lease renewals and the housekeeping they stay within the database pool
        anyio.to_thread.current_default_thread_limiter().total_tokens = svc.settings.http_threads
        svc.worker.start()
        if svc.deliveries is not None:
            svc.deliveries.start()
        try:
            yield
        finally:
            svc.stopping = True
            svc.hub.wake_all()  # waiting streams see it now
            await run_in_threadpool(shutdown, svc)

    app = FastAPI(title="harness-kernel", version=_version(), description=DESCRIPTION, lifespan=lifespan,
                  docs_url=None)  # served by entrances, with its assets
    app.state.service = svc
    errors.install(app)
    for router in (runs.router, files.router, approvals.router, ops.router, webhooks.router, costs.router, kb.router,
                   console.router, console_more.router):
        app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=STATIC_DIR), name="static")
    entrances.install(app)

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse("/ui/runs", status_code=307)

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> FileResponse:  # browsers ask for it before reading the page's icon link
        return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml")

    app.add_middleware(BodyLimit, max_bytes=svc.ops.settings.limits.max_request_bytes)
    app.add_middleware(NulGuard)
    app.add_middleware(RequestLog, metrics=svc.metrics)
    return app


def shutdown(svc: Service) -> None:
    """Stop the worker, flush spans, and close the runtime if this service built it."""
    svc.stopping = True
    svc.worker.stop()
    if svc.deliveries is not None:
        svc.deliveries.stop()
        svc.deliveries.dispatcher.close()
    if svc.telemetry is not None:
        svc.telemetry.shutdown()
    if svc.owns_runtime:
        svc.ops.close()


def service_of_app(app: Any) -> Service:
    """The Service behind an app built by create_app (for tests and embedding)."""
    svc: Service = app.state.service
    return svc
