"""How an MCP tool's risk is decided, and what a broken MCP config file says."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("mcp")

from mcp_types import ToolAnnotations

from harness.adapters.mcp_client import McpClient
from harness.domain.errors import InvalidRequestError
from harness.policy.risk import Risk, level_for
from harness.skills.mcp import McpServers, ToolConfig, load_mcp_file, risk_for, skill_name


def test_a_tool_without_annotations_or_config_is_a_non_idempotent_write() -> None:
    """Nothing said about a tool never makes it L1: it is a write that needs approval and is not retried."""
    for hints in (None, ToolAnnotations(title="only a title")):
        risk, idempotent, source = risk_for(hints, None, trusted=True)
        assert (risk.access, level_for(risk), idempotent, source) == ("write", "L2", False, "default")


def test_an_untrusted_servers_annotations_never_lower_the_risk() -> None:
    """On a server not marked trusted, readOnlyHint / idempotentHint / destructiveHint=false are not believed: the
    tool is a non-idempotent write (L2); the hints that raise its risk are kept (openWorldHint: production, L4)."""
    claims = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False)
    risk, idempotent, source = risk_for(claims, None, trusted=False)
    assert (risk.access, level_for(risk), idempotent, source) == ("write", "L2", False, "untrusted")
    world, _, _ = risk_for(ToolAnnotations(read_only_hint=True, open_world_hint=True), None, trusted=False)
    assert (world.space, level_for(world)) == ("production", "L4")
    rated, idempotent, source = risk_for(claims, ToolConfig(idempotent=True), trusted=False)
    assert (level_for(rated), idempotent, source) == ("L2", True, "untrusted")


def test_annotations_decide_the_risk_when_the_config_is_silent() -> None:
    """On a trusted server, readOnlyHint reads at L1; a write reaching the open world is a production write;
    idempotentHint is kept."""
    read, idem, _ = risk_for(ToolAnnotations(read_only_hint=True), None, trusted=True)
    assert (level_for(read), idem) == ("L1", True)
    local, idem, _ = risk_for(ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True,
                                              open_world_hint=False), None, trusted=True)
    assert (local.space, local.impact, level_for(local), idem) == ("project", "medium", "L2", True)
    world, idem, source = risk_for(ToolAnnotations(read_only_hint=False, open_world_hint=True), None,
                                       trusted=True)
    assert (world.space, world.impact, level_for(world), idem, source) == ("production", "high", "L4", False,
                                                                           "annotations")


def test_the_config_overrides_the_annotations() -> None:
    """A deployment may rate a tool otherwise than its server does; a write it rates is not idempotent unless
    it says so."""
    config = ToolConfig(risk=Risk(access="write", space="production", impact="high"))
    risk, idempotent, source = risk_for(ToolAnnotations(read_only_hint=True), config, trusted=False)
    assert (level_for(risk), idempotent, source) == ("L4", False, "config")
    risk, idempotent, _ = risk_for(None, ToolConfig(risk=Risk(access="read"), idempotent=True), trusted=False)
    assert (level_for(risk), idempotent) == ("L1", True)


def test_tool_names_become_skill_ids() -> None:
    """Any tool name maps to the second part of a valid skill id."""
    assert skill_name("git_status") == "git_status"
    assert skill_name("Read-File") == "read_file"
    assert skill_name("2fa") == "t_2fa"


@pytest.mark.parametrize(("text", "named"), [
    ("servers: {git: {command: [x], url: 'http://127.0.0.1:1/mcp'}}", "servers.git: give either command"),
    ("servers: {git: {}}", "servers.git: give either command"),
    ("servers: {Git: {command: [x]}}", "servers.Git: a server name is lower case"),
    ("servers: {git: {url: 'ftp://x'}}", "servers.git.url"),
    ("servers: {git: {command: [x], tools: {t: {risk: {access: maybe}}}}}", "servers.git.tools.t.risk.access"),
    ("servers: {git: {command: [x], colour: red}}", "servers.git.colour"),
    ("servers: {git: {command: [x], trusted: perhaps}}", "servers.git.trusted"),
    ("untrusted_tools: ignore\nservers: {}", "untrusted_tools"),
])
def test_a_broken_mcp_file_names_the_field(tmp_path: Path, text: str, named: str) -> None:
    """Each mistake in the MCP config file is refused with the file and the field named."""
    path = tmp_path / "mcp.yaml"
    path.write_text(text)
    with pytest.raises(InvalidRequestError, match=r"mcp\.yaml: " + named.replace(".", r"\.")):
        load_mcp_file(path)


def test_a_server_may_not_shadow_a_skill_group(tmp_path: Path) -> None:
    """A server named like the first part of a file skill's id is refused: its tools would mix with them."""
    path = tmp_path / "mcp.yaml"
    path.write_text("servers: {orders: {command: [x]}}")
    with pytest.raises(InvalidRequestError, match=r"servers\.orders: the name is already"):
        McpServers(load_mcp_file(path), connector=McpClient(), config_path=path, reserved_groups=["orders", "notes"])
