"""`harness sandbox serve`: this host's sandbox for harness processes elsewhere (the remote sandbox provider).

Point them at it with HARNESS_SANDBOX_PROVIDER=remote (or HARNESS_SANDBOX_REMOTE_TENANTS / _SKILLS),
HARNESS_SANDBOX_URL and the same HARNESS_SANDBOX_TOKEN.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from harness.cli.support import cli_errors, fail

sandbox_app = typer.Typer(help="Run sandboxed calls for harness processes on other hosts.", no_args_is_help=True)


@sandbox_app.command("serve")
@cli_errors
def serve(
    host: Annotated[str, typer.Option("--host", help="The address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="The TCP port to listen on.", min=1, max=65535)] = 8790,
    data_dir: Annotated[Path | None, typer.Option(
        "--data-dir", help="Where the skills' code and the Runs' working directories sent here are kept "
                           "(default: the data directory's sandbox-server folder).")] = None,
) -> None:
    """Run sandboxed skill calls (and kept instances) sent over HTTP, each authenticated by the bearer
    token in HARNESS_SANDBOX_TOKEN, until SIGTERM or SIGINT. Each call brings the skill's code and the Run's
    files this host lacks, and takes back what the call changed: this host shares no files with the harness.
    Skills from installed packages must be installed here too, at the same version."""
    from harness.settings import Settings
    from harness.wiring.sandbox import sandbox_server

    token = os.environ.get("HARNESS_SANDBOX_TOKEN", "")
    if len(token) < 16:
        fail("HARNESS_SANDBOX_TOKEN must be set to a secret of at least 16 characters")
    server = sandbox_server(Settings.from_env(), token, host, port, data_dir)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    typer.echo(f"sandbox server on http://{host}:{server.server_port}", err=True)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
