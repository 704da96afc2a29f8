"""`harness skills list`: the skills a deployment offers, where each comes from and what approval it needs."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from harness.cli.support import DbOption, JsonOption, cli_errors, emit
from harness.config import Runtime, Settings, build_runtime
from harness.policy.risk import level_for
from harness.skills import Skill

skills_app = typer.Typer(help="The skills Runs may use.", no_args_is_help=True)


def skill_document(rt: Runtime, skill: Skill) -> dict[str, Any]:
    """One skill as `skills list` shows it: source, risk, approval level and where the risk came from."""
    manifest = skill.manifest
    if manifest.kind == "mcp" and rt.mcp is not None:
        source, risk_from = rt.mcp.describe(skill)
    else:
        source, risk_from = str(skill.path), "manifest"
    return {"id": skill.id, "version": manifest.version, "kind": manifest.kind, "source": source,
            "risk": manifest.risk.model_dump(), "level": level_for(manifest.risk), "risk_from": risk_from,
            "idempotent": manifest.idempotent, "timeout_s": manifest.timeout_s,
            "manifest_hash": skill.manifest_hash, "description": manifest.description}


@skills_app.command("list")
@cli_errors
def list_skills(db: DbOption = None, json_: JsonOption = False) -> None:
    """List every skill (MCP servers' tools included: their servers are started to list them)."""
    rt = build_runtime(Settings.from_env(db=db))
    try:
        docs = [skill_document(rt, s) for s in rt.registry.all()]
    finally:
        rt.close()
    if json_:
        emit({"skills": docs})
        return
    table = Table("skill", "version", "source", "risk", "level", "idempotent")
    for d in docs:
        risk = d["risk"]
        table.add_row(d["id"], d["version"], d["source"],
                      f"{risk['access']}/{risk['space']}/{risk['impact']} ({d['risk_from']})", d["level"],
                      "yes" if d["idempotent"] else "no")
    Console(width=200).print(table)
