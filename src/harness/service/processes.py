"""`harness serve --processes N`: N service processes behind one listening socket.

One Python process drives Runs on one core at a time; a second process on the same database doubles what
the service can do before its interpreter is the limit. The processes are replicas (each the whole service:
it drives the Runs it accepts, re-drives any that nobody drives, sweeps, drains), started by a small
supervisor, uvicorn's, that binds the socket once and hands it to each: the kernel spreads connections
between them. Everything that makes replicas safe on one database holds here unchanged (a Run's lease,
one migration at a time, events re-read from the database for Runs another process drives).

What the supervisor adds:
- the first process starts alone, and the others once it serves: a new database is migrated by it, and
  a bad setting or an unreachable database stops the command after one attempt, not N;
- every process signs console sessions with the same secret (HARNESS_SESSION_SECRET, else one drawn here),
  so a login through one process holds in the others;
- a process that dies is started again; SIGTERM or SIGINT stops them all, each finishing as `serve` does;
- a process ends with the supervisor, even one killed with SIGKILL (Linux: the parent-death signal), so no
  orphan goes on holding the port.

The supervisor imports no part of the service: each process builds its own from the arguments handed to it
in HARNESS_SERVE_CHILD (the command's options) and the environment it inherits.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fastapi import FastAPI

#: the command's options, for each service process (JSON)
CHILD_ENV = "HARNESS_SERVE_CHILD"
#: how long the first process may take to migrate and start, seconds
FIRST_START_S = 300.0
#: how a process that could not start ends (uvicorn's STARTUP_FAILURE: its supervisor does not start it again)
START_FAILED = 3
#: a process that does not answer the supervisor's ping for this long is taken as hung and replaced
HEALTHCHECK_S = 30


def child_app() -> FastAPI:
    """The service of one process (uvicorn's app factory, called in each process the supervisor starts)."""
    args: dict[str, Any] = json.loads(os.environ[CHILD_ENV])
    _end_with(int(args["parent"]))
    import typer

    from harness.cli.startup import kept_until_exit, process_is_own
    from harness.cli.support import cli_errors
    from harness.service import logs

    logs.configure(json_lines=bool(args["log_json"]), level=str(args["log_level"]))
    process_is_own()  # started for the service alone: its start may pause the collector, as the script's does
    try:
        # a bad setting or database is reported as the command reports it (one line, no traceback), and the
        # process ends with uvicorn's start-failure code: the supervisor then stops instead of retrying
        with kept_until_exit():  # built with the collector paused, then frozen (harness.cli.startup)
            return cli_errors(_build)(args)
    except typer.Exit:
        raise SystemExit(START_FAILED) from None
    except Exception:
        logging.getLogger("harness.service").exception("the service process could not start")
        raise SystemExit(START_FAILED) from None


def _build(args: dict[str, Any]) -> FastAPI:
    from harness.service.app import create_app
    from harness.service.settings import ServiceSettings
    from harness.settings import Settings

    settings = ServiceSettings.from_env(concurrency=args["workers"], otel_exporter=args["otel"])
    return create_app(settings=settings, runtime_settings=Settings.from_env(db=args["db"], agent=args["agent"]))


def _end_with(parent: int) -> None:
    """Have the kernel send this process SIGTERM when the supervisor dies (Linux), and stop at once if it
    already has."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def run(*, host: str, port: int, processes: int, log_level: str, options: dict[str, Any]) -> int:
    """Serve with `processes` processes until SIGTERM or SIGINT. Returns 1 when a process could not start
    (its error is in the log above), else 0."""
    import uvicorn
    from uvicorn.supervisors.multiprocess import Multiprocess, Process

    class Supervisor(Multiprocess):
        def init_processes(self) -> None:
            first = Process(self.config, self.sockets)
            first.start()
            self.processes.append(first)
            if not first.wait_until_ready(FIRST_START_S, self.should_exit):
                return  # the supervisor's loop sees it dead (and stops on a start failure) or stops
            for _ in range(self.processes_num - 1):
                process = Process(self.config, self.sockets)
                process.start()
                self.processes.append(process)

    os.environ.setdefault("HARNESS_SESSION_SECRET", secrets.token_hex(32))
    os.environ[CHILD_ENV] = json.dumps({**options, "log_level": log_level, "parent": os.getpid()})
    config = uvicorn.Config("harness.service.processes:child_app", factory=True, host=host, port=port,
                            workers=processes, log_config=None, access_log=False, timeout_graceful_shutdown=3,
                            timeout_worker_healthcheck=HEALTHCHECK_S, log_level=log_level)
    try:
        sockets = [config.bind_socket()]
    except SystemExit as exc:  # uvicorn logged why (the port taken since serve checked it) and ends with code 3:
        if exc.code != START_FAILED:  # in this process, the command's, that is a start failure like any other
            raise
        return 1
    supervisor = Supervisor(config, sockets=sockets)
    supervisor.run()
    return 1 if any(p.exitcode == START_FAILED for p in supervisor.processes) else 0
