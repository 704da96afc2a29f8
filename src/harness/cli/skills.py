"""`harness skills list`: the skills a deployment offers, where each comes from and what approval it needs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from harness.cli.runs import operations
from harness.cli.support import DbOption, JsonOption, cli_errors, emit, screen

if TYPE_CHECKING:
    from harness.operations import Operations
    from harness.skills.manifests import Skill

skills_app = typer.Typer(help="The skills Runs may use.", no_args_is_help=True)


def skill_document(ops: Operations, skill: Skill) -> dict[str, Any]:
    """One skill as `skills list` shows it: source, risk, approval level, where the risk came from, whether
    it runs on its server's word (a trusted MCP server's annotations decided its risk), and the JSON Schemas
    of its arguments and of its result (what a caller or a model must send)."""
    from harness.policy.risk import level_for

    manifest = skill.manifest
    trusted: bool | None = None
    if manifest.kind == "mcp" and ops.mcp is not None:
        source, risk_from = ops.mcp.describe(skill)
        trusted = ops.mcp.trusted(skill)
    else:
        source, risk_from = str(skill.path), "manifest"
    return {"id": skill.id, "version": manifest.version, "kind": manifest.kind, "source": source,
            "risk": manifest.risk.model_dump(), "level": level_for(manifest.risk), "risk_from": risk_from,
            "on_servers_word": risk_from == "annotations", "server_trusted": trusted,
            "idempotent": manifest.idempotent, "timeout_s": manifest.timeout_s,
            "manifest_hash": skill.manifest_hash, "description": manifest.description,
            "input_schema": manifest.input_schema, "output_schema": manifest.output_schema}


@skills_app.command("list")
@cli_errors
def list_skills(db: DbOption = None, json_: JsonOption = False) -> None:
    """List every skill (MCP servers' tools included: their servers are started to list them); --json adds
    each skill's input and output schema."""
    ops = operations(db)
    try:
        docs = [skill_document(ops, s) for s in ops.registry.all()]
        withheld = [{"server": w.server, "tool": w.tool, "reason": w.reason}
                    for w in (ops.mcp.withheld() if ops.mcp is not None else [])]
    finally:
        ops.close()
    if json_:
        emit({"skills": docs, "withheld": withheld})
        return
    from rich.table import Table

    table = Table("skill", "version", "source", "risk", "level", "idempotent", "server's word")
    for d in docs:
        risk = d["risk"]
        table.add_row(d["id"], d["version"], d["source"],
                      f"{risk['access']}/{risk['space']}/{risk['impact']} ({d['risk_from']})", d["level"],
                      "yes" if d["idempotent"] else "no", "yes" if d["on_servers_word"] else "no")
    console = screen()
    console.print(table)
    for w in withheld:
        console.print(f"not offered: {w['server']}.{w['tool']}: {w['reason']}")
