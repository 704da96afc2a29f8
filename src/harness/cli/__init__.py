"""The `harness` command line: a thin shell over the library (SPEC U1).

One module per topic: runs (run, trace, cancel, approvals), demo, show (runs show), audit, archive,
webhooks (and costs), ops (sweep, worker), serve, replay, skills, witness, signer, kb (knowledge bases),
sandbox (the sandbox server);
support holds the options, the output helpers and the error handling they share.
"""

from __future__ import annotations

import atexit
import gc

from harness.cli import archive, demo, ops, replay, runs, serve, show, webhooks
from harness.cli.audit import audit_app
from harness.cli.kb import kb_app
from harness.cli.sandbox import sandbox_app
from harness.cli.signer import signer_app
from harness.cli.skills import skills_app
from harness.cli.support import cli_errors, make_app
from harness.cli.witness import witness_app

app = make_app()
app.add_typer(show.runs_app, name="runs")
app.add_typer(audit_app, name="audit")
app.add_typer(webhooks.webhooks_app, name="webhooks")
app.command("costs")(webhooks.costs)
app.add_typer(witness_app, name="witness")
app.add_typer(skills_app, name="skills")
app.add_typer(signer_app, name="signer")
app.add_typer(kb_app, name="kb")
app.add_typer(sandbox_app, name="sandbox")
for _name, _fn in (("run", runs.run), ("trace", runs.trace), ("cancel", runs.cancel),
                   ("approve", runs.approve), ("reject", runs.reject), ("approvals", runs.approvals),
                   ("demo", demo.demo), ("sweep", ops.sweep), ("serve", serve.serve),
                   ("replay", replay.replay), ("worker", ops.worker), ("archive", archive.archive),
                   ("erase", archive.erase)):
    app.command(_name)(cli_errors(_fn))


def main() -> None:
    """Entry point of the `harness` script."""
    # At exit the interpreter's garbage collections traverse every object the command still holds (the
    # runtime, SQLAlchemy's and pydantic's structures: ~80,000 objects after an approve), ~0.1 s of CPU spent
    # finding nothing to free. Frozen, they are left to the process's end; atexit handlers registered later
    # (thread pools, logging) run before this one, and objects freed by reference counting are freed as before.
    atexit.register(gc.freeze)
    app()


__all__ = ["app", "main"]
