"""`harness witness serve`: a checkpoint witness over HTTP (SPEC A3b, harness.audit.witness_server)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from harness.audit.places import TOKEN_ENV

witness_app = typer.Typer(help="Keep a second, append-only copy of checkpoints.", no_args_is_help=True)


@witness_app.command("serve")
def serve(
    dir_: Annotated[Path, typer.Option("--dir", help="Where the witness keeps the checkpoints it accepts.")],
    host: Annotated[str, typer.Option("--host", help="Interface to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="TCP port.")] = 8077,
    token_env: Annotated[str, typer.Option(
        "--token-env", help="Environment variable holding the bearer token submissions need.")] = TOKEN_ENV,
) -> None:
    """Serve a witness that keeps every checkpoint it is given, append-only, and refuses any that is not
    signed by the key it trusts or does not extend what it holds."""
    import uvicorn

    from harness.audit.witness_server import create_witness_app

    if dir_.exists() and not dir_.is_dir():
        typer.echo(f"error: {dir_} is not a directory", err=True)
        raise typer.Exit(2)
    dir_.mkdir(parents=True, exist_ok=True)
    token = os.environ.get(token_env) or None
    typer.echo(f"harness witness on http://{host}:{port}/ keeping checkpoints in {dir_}"
               f"{' (submissions need the bearer token)' if token else ''}", err=True)
    uvicorn.run(create_witness_app(dir_, token), host=host, port=port, log_level="warning", access_log=False)
