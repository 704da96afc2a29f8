"""`harness serve`: the HTTP API, the web console and the embedded worker in one process (SPEC U1, U2, D1)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from harness.cli.startup import kept_until_exit
from harness.cli.support import AgentOption, DbOption, agent_reference, check_agent, fail

if TYPE_CHECKING:
    from harness.service.settings import ServiceSettings
    from harness.settings import Settings

Host = Annotated[str, typer.Option("--host", help="Interface to listen on.")]
Port = Annotated[int, typer.Option("--port", min=0, max=65535, help="TCP port (0 picks a free one).")]


def serve(
    host: Host = "127.0.0.1",
    port: Port = 8000,
    db: DbOption = None,
    agent: AgentOption = None,
    workers: Annotated[
        int | None,
        typer.Option("--workers", min=1, max=100_000,
                     help="Runs driven at once; a waiting Run holds no thread (HARNESS_DRIVE_CONCURRENCY, "
                          "default 1000)."),
    ] = None,
    log_json: Annotated[
        bool, typer.Option("--log-json", help="Structured logs: one JSON object per line.")
    ] = False,
    log_level: Annotated[str, typer.Option("--log-level", help="debug, info, warning or error.")] = "info",
    otel: Annotated[
        str | None,
        typer.Option("--otel", help="Span exporter: none, console or otlp (HARNESS_OTEL_EXPORTER)."),
    ] = None,
    processes: Annotated[
        int,
        typer.Option("--processes", min=1, max=64, envvar="HARNESS_SERVE_PROCESSES", show_envvar=True,
                     help="Service processes on the one port, each a replica that drives the Runs it accepts: "
                          "more than one uses more than one core."),
    ] = 1,
) -> None:
    """Serve the HTTP API (OpenAPI at /docs) and the web console (/ui) on the embedded default."""
    # the start (its imports, the settings, the schema, the service) runs with the collector paused, and what
    # it built is frozen before the service answers (harness.cli.startup)
    with kept_until_exit():
        settings, runtime_settings = _checked(host, port, db, agent, workers=workers, otel=otel,
                                              log_json=log_json, log_level=log_level)
    shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    if processes > 1:
        from harness.service import processes as supervisor

        typer.echo(f"harness service on http://{shown}:{port}/ in {processes} processes  (console /ui, API docs "
                   "/docs, metrics /metrics of the process that answers)", err=True)
        options = {"db": db, "agent": agent_reference(agent), "workers": workers, "otel": otel,
                   "log_json": log_json}
        code = supervisor.run(host=host, port=port, processes=processes, log_level=log_level.lower(),
                              options=options)
        if code:  # a setting, the database or the agent: what one process reports as bad input
            fail("the service could not start (the reason is above)")
        return
    with kept_until_exit():
        # imported here so that every other `harness` command starts without loading the web stack
        import uvicorn
        from uvicorn.config import STARTUP_FAILURE

        from harness.service.app import create_app

        # the service builds its runtime (and owns it), the context's vocabulary loaded before the first Run
        app = create_app(settings=settings, runtime_settings=runtime_settings)
    typer.echo(
        f"harness service on http://{shown}:{port}/  (console /ui, API docs /docs, metrics /metrics)",
        err=True,
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=3,
        log_level=log_level.lower(),
    )
    try:
        uvicorn.Server(config).run()
    except SystemExit as exc:  # uvicorn's start failure (logged above): the port taken since the check, say
        if exc.code != STARTUP_FAILURE:
            raise
        fail("the service could not start (the reason is above)")


def _checked(host: str, port: int, db: str | None, agent: str | None, *, workers: int | None, otel: str | None,
             log_json: bool, log_level: str) -> tuple[ServiceSettings, Settings]:
    """The service's and the runtime's settings, checked before any process starts (each process builds its
    own service from them), the port free to listen on, and the database reached with its schema made
    current: an unreachable database or a newer harness-kernel's schema is one error, not a start failure
    of each replica."""
    from harness.service import logs
    from harness.service.settings import ServiceSettings
    from harness.settings import Settings
    from harness.stores import prepare_schema

    if log_level.lower() not in ("debug", "info", "warning", "error"):
        raise typer.BadParameter("must be debug, info, warning or error", param_hint="--log-level")
    logs.configure(json_lines=log_json, level=log_level)
    settings = ServiceSettings.from_env(concurrency=workers, otel_exporter=otel)
    runtime_settings = Settings.from_env(db=db, agent=agent_reference(agent))
    check_agent(runtime_settings.agent)
    can_listen(host, port)
    prepare_schema(runtime_settings.db)
    return settings, runtime_settings


def can_listen(host: str, port: int) -> None:
    """Bind `host`:`port` as the server will (asyncio's `create_server`, uvicorn's own call) and let it go
    again: a port in use or a host that is no address of this machine stops the command with one line and
    exit 2 before the service is built (uvicorn would end with its own code, 3, after building it)."""
    import asyncio
    import os
    import socket

    async def probe() -> None:
        server = await asyncio.get_running_loop().create_server(asyncio.Protocol, host, port)
        server.close()
        await server.wait_closed()

    try:
        asyncio.run(probe())
    except OSError as exc:
        # asyncio words a failed bind "error while attempting to bind on address ...": the errno says it shorter
        reason = exc.strerror if isinstance(exc, socket.gaierror) or not exc.errno else os.strerror(exc.errno)
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        fail(f"cannot listen on {where}: {reason}")
