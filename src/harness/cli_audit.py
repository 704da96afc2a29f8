"""`harness audit …`: verify, reconcile, checkpoint, export, drain (SPEC A3, A3b, A4, K8)."""

from __future__ import annotations

import typer

audit_app = typer.Typer(help="Verify and publish the tamper-evident audit trail.", no_args_is_help=True)
