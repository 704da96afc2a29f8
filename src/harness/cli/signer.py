"""`harness signer serve`: the checkpoint signing key in a process of its own (harness.ports.signer).

Run it as a user of its own, with the key readable by that user only; point the harness processes at its
socket with HARNESS_SIGNER_SOCKET. They then hold no key, so no skill they run can read it.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Annotated

import typer

from harness.cli.support import cli_errors, fail

signer_app = typer.Typer(help="Sign checkpoints in a process of its own.", no_args_is_help=True)


@signer_app.command("serve")
@cli_errors
def serve(
    socket_path: Annotated[Path, typer.Option("--socket", help="The Unix socket to listen on (created 0600).")],
    key: Annotated[Path, typer.Option("--key", help="The Ed25519 signing key (PEM, mode 0600).")],
    allow_uid: Annotated[list[int] | None, typer.Option(
        "--allow-uid", help="A uid whose processes may ask for signatures, repeatable (default: this "
                            "process's own uid; others make the socket 0666, the uid check decides).")] = None,
    database: Annotated[list[str] | None, typer.Option(
        "--database", help="Sign only this database's checkpoints, repeatable (default: any).")] = None,
) -> None:
    """Hold the checkpoint signing key and sign checkpoint tree heads asked for over a Unix socket, until
    SIGTERM or SIGINT. It signs nothing but a canonical tree head of its own key, and never two roots for
    one tree size of one database."""
    from harness.wiring.signer import signer_server

    if not key.is_file():
        fail(f"--key {key}: no such file")
    if not socket_path.parent.is_dir():
        fail(f"--socket {socket_path}: the folder {socket_path.parent} does not exist")
    server = signer_server(socket_path, key, allow_uid or (), database or ())
    server.open()

    def stop(signum: int, frame: FrameType | None) -> None:
        threading.Thread(target=server.stop, daemon=True).start()  # stop() waits for serve_forever to return

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    typer.echo(f"harness signer on {socket_path}", err=True)
    server.serve_forever()
