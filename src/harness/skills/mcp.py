"""MCP servers as skill sources: each tool of a configured server is a skill (kind `mcp`).

The deployment names its servers in a YAML file (HARNESS_MCP_FILE, or `mcp_file` in the config file)::

    untrusted_tools: approve                 # or refuse: unconfigured tools of untrusted servers
    servers:
      git:                                   # skills are git.<tool>; Cedar sees SkillGroup::"git"
        command: [mcp-server-git, --repository, /srv/repo]   # stdio: the program and its arguments
        env: {GIT_AUTHOR_NAME: agent}        # added to a minimal environment (PATH, HOME, ...)
        cwd: /srv                            # relative to this file's folder
      notes:
        url: http://127.0.0.1:8765/mcp       # streamable HTTP
        include: [notes_read, notes_add]     # only these tools become skills (default: every tool)
        timeout_s: 20                        # the default time limit of each call
        price_per_call_usd: 0.0001           # what one call costs (its CostTrace)
        trusted: true                        # believe its tools' annotations (readOnlyHint → L1)
        tools:
          notes_add:                         # per tool: risk, idempotent, timeout_s, retry, breaker
            risk: {access: write, space: personal, impact: low}
            idempotent: false

A tool's annotations are its server's word, not the operator's. A tool's risk is its config's; else, on a
server the file marks `trusted: true`, it follows the tool's annotations: readOnlyHint → a read (L1);
otherwise a write, in production space when openWorldHint is set (it reaches outside), else in project
space, high impact unless destructiveHint is false, idempotent only when idempotentHint says so. On a server
not marked trusted (the default) an unconfigured tool is a non-idempotent write whatever it claims (only
the hints that raise its risk are kept: openWorldHint → production, destructiveHint → high impact), so it
waits for approval; with `untrusted_tools: refuse` (for the file, or one server) it is not offered at all.
A tool with neither config nor annotations is a non-idempotent write in project space — never silently L1.

A skill's manifest hash is pinned from the server's identity (its name in the config, its transport
and target, the name and version it reports) and the tool's name, description, schemas and
annotations, and its config: a Run pinned at PREPARING refuses a tool whose listing changed before it
executes (manifest_changed), as it refuses an upgraded YAML skill. The executor lists the server's tools
again right before each call, so a change is caught even when nothing told the registry.

Servers are started at their first use (a Run's PREPARING, `harness skills list`), kept by the process,
opened again when they died (audited on the Run as `mcp_server_restarted`), and closed with the Runtime.
"""

from __future__ import annotations

import contextvars
import functools
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import mcp_types
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.domain.chain import content_hash
from harness.domain.errors import ContextError, InvalidRequestError
from harness.domain.traces import CostTrace
from harness.pipeline.tool_kinds import Attempt, ToolCallError
from harness.policy.risk import Risk
from harness.ports.mcp import Listing, McpConnection, McpConnector, McpError, Target
from harness.skills.manifests import BreakerSettings, Manifest, RetryPolicy, Skill
from harness.yamlfile import read_yaml

__all__ = ["McpCalls", "McpServers", "McpUnavailableError", "ServerConfig", "ToolConfig", "Withheld", "load_mcp_file",
           "risk_for"]

_SERVER_NAME = r"^[a-z][a-z0-9_]*$"
#: the call this thread is making (run_id, step_id, skill id): a restart it causes is audited on its Run
_CALLING: contextvars.ContextVar[tuple[str, str, str] | None] = contextvars.ContextVar("mcp_calling", default=None)
_LIST_TIMEOUT_S = 30.0


class McpUnavailableError(ContextError):
    """An MCP server whose tools a Run would see could not be listed: the Run fails at PREPARING."""

    code = "mcp_unavailable"


#: approve: an unconfigured tool of an untrusted server is a write that waits for approval; refuse: not offered
UntrustedTools = Literal["approve", "refuse"]


class ToolConfig(BaseModel):
    """What the deployment says about one tool, over what its annotations say."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    risk: Risk | None = None
    idempotent: bool | None = None
    timeout_s: float | None = Field(default=None, gt=0, le=3_600)
    retry: RetryPolicy | None = None
    breaker: BreakerSettings | None = None


class ServerConfig(BaseModel):
    """One MCP server: a stdio command or a streamable HTTP URL, and how its tools are governed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    command: tuple[str, ...] | None = Field(default=None, min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    cwd: str | None = None
    url: str | None = Field(default=None, pattern=r"^https?://")
    include: tuple[str, ...] | None = None
    timeout_s: float = Field(default=30.0, gt=0, le=3_600)
    connect_timeout_s: float = Field(default=30.0, gt=0, le=600)
    price_per_call_usd: float = Field(default=0.0, ge=0)
    #: believe the tools' annotations (readOnlyHint, idempotentHint, ...): the operator vouches for the server
    trusted: bool = False
    #: what becomes of a tool of an untrusted server whose risk the file does not give (None: the file's rule)
    untrusted_tools: UntrustedTools | None = None
    tools: dict[str, ToolConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _one_transport(self) -> ServerConfig:
        if (self.command is None) == (self.url is None):
            raise ValueError("give either command (stdio) or url (streamable HTTP)")
        if self.url is not None and (self.env or self.cwd):
            raise ValueError("env and cwd are for a stdio server (command), not a URL")
        return self


class McpFile(BaseModel):
    """The MCP config file."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    untrusted_tools: UntrustedTools = "approve"
    servers: dict[str, ServerConfig] = Field(default_factory=dict)


def load_mcp_file(path: Path) -> dict[str, ServerConfig]:
    """The servers an MCP config file names (each with the file's `untrusted_tools` unless it says its own);
    InvalidRequestError naming the file and field otherwise."""
    raw = read_yaml(path, InvalidRequestError, "the MCP config file")
    try:
        parsed = McpFile.model_validate(raw or {})
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise InvalidRequestError(f"{path}: {where}: {str(err['msg']).removeprefix('Value error, ')}") from exc
    for name in parsed.servers:
        if not re.match(_SERVER_NAME, name):
            raise InvalidRequestError(f"{path}: servers.{name}: a server name is lower case letters, digits and "
                                      "_ (it is the first part of its skills' ids)")
    base = path.resolve().parent
    return {name: s.model_copy(update={"cwd": str(base / s.cwd) if s.cwd else None,
                                       "untrusted_tools": s.untrusted_tools or parsed.untrusted_tools})
            for name, s in parsed.servers.items()}


def risk_for(annotations: mcp_types.ToolAnnotations | None, config: ToolConfig | None, *,
             trusted: bool) -> tuple[Risk, bool, str]:
    """(risk, idempotent, where the risk came from) of one tool. Where: "config" (the operator rated it),
    "annotations" (a trusted server's word), "untrusted" (an untrusted server's annotations, not believed:
    a write, raised by openWorldHint / destructiveHint only) or "default" (nothing said: a write)."""
    hinted = annotations is not None and any(
        getattr(annotations, h) is not None
        for h in ("read_only_hint", "destructive_hint", "idempotent_hint", "open_world_hint"))
    if not hinted or annotations is None:
        risk, idempotent, source = Risk(access="write", space="project", impact="medium"), False, "default"
    elif not trusted:
        risk = Risk(access="write", space="production" if annotations.open_world_hint else "project",
                    impact="high" if annotations.destructive_hint else "medium")
        idempotent, source = False, "untrusted"
    elif annotations.read_only_hint:
        risk, idempotent, source = Risk(access="read"), True, "annotations"
    else:
        risk = Risk(access="write", space="production" if annotations.open_world_hint else "project",
                    impact="medium" if annotations.destructive_hint is False else "high")
        idempotent, source = bool(annotations.idempotent_hint), "annotations"
    if config is not None and config.risk is not None:
        risk, source = config.risk, "config"
        idempotent = idempotent and risk.access == "read"
    if config is not None and config.idempotent is not None:
        idempotent = config.idempotent
    return risk, idempotent, source


def skill_name(tool: str) -> str:
    """A tool's name as the second part of a skill id (lower case, `_` for anything else)."""
    name = re.sub(r"[^a-z0-9_]", "_", tool.lower())
    return name if re.match(r"^[a-z]", name) else f"t_{name}"


@dataclass(frozen=True)
class McpTool:
    """What the executor needs beyond the manifest: which server and which tool name on the wire."""

    server: str
    tool: str
    risk_source: str


@dataclass(frozen=True)
class Withheld:
    """A tool of a server that is not offered as a skill, and why (`harness skills list` names it)."""

    server: str
    tool: str
    reason: str


class McpServers:
    """The configured servers of one process: their connections, and their tools as skills (a SkillSource)."""

    def __init__(self, servers: dict[str, ServerConfig], *, connector: McpConnector, config_path: Path | None = None,
                 reserved_groups: Sequence[str] = ()) -> None:
        clash = sorted(set(servers) & set(reserved_groups))
        if clash:
            raise InvalidRequestError(f"{config_path or 'MCP config'}: servers.{clash[0]}: the name is already the "
                                      "first part of a skill's id from the skills folders; rename the server")
        self.configs = servers
        self.path = config_path or Path("mcp")
        self._connector = connector
        self.connections: dict[str, McpConnection] = {
            name: connector.connect(_target(name, cfg), connect_timeout_s=cfg.connect_timeout_s,
                                    on_restart=functools.partial(self._restarted, name))
            for name, cfg in servers.items()}
        #: (run_id or None, event, detail): a restart goes on the audit trail, on the Run whose call met it
        self.audit: Callable[[str | None, str, dict[str, Any]], None] | None = None
        self._lock = threading.Lock()
        self._skills: dict[str, dict[str, Skill]] = {}
        self._withheld: dict[str, list[Withheld]] = {}
        self.tools: dict[str, McpTool] = {}

    # ------------------------------------------------------------------ the SkillSource
    def skills(self) -> list[Skill]:
        """Every server's tools, listed now (starting servers that are not running)."""
        out: list[Skill] = []
        for name in self.configs:
            try:
                out.extend(self.refresh(name).values())
            except McpError as exc:
                raise McpUnavailableError(str(exc)) from exc
        return out

    def get(self, skill_id: str) -> Skill | None:
        """The skill as last listed; a server never listed by this process is listed now (None if it
        cannot be reached: nothing of it runs)."""
        server = skill_id.split(".", 1)[0]
        if server not in self.configs:
            return None
        with self._lock:
            known = self._skills.get(server)
        if known is None:
            try:
                known = self.refresh(server)
            except McpError:
                return None
        return known.get(skill_id)

    def refresh(self, server: str) -> dict[str, Skill]:
        """List one server's tools now and keep them as its skills."""
        listing = self.connections[server].listing(_LIST_TIMEOUT_S)
        skills, withheld = self._to_skills(server, listing)
        with self._lock:
            self._skills[server] = skills
            self._withheld[server] = withheld
        return skills

    def describe(self, skill: Skill) -> tuple[str, str]:
        """(source, where its risk came from) of an MCP skill, for `harness skills list`."""
        tool = self.tools[skill.id]
        target = self.connections[tool.server].target
        return f"mcp:{tool.server} ({target.transport})", tool.risk_source

    def trusted(self, skill: Skill) -> bool:
        """Whether the file marks the skill's server trusted (its annotations are believed)."""
        return self.configs[self.tools[skill.id].server].trusted

    def withheld(self) -> list[Withheld]:
        """The tools of the servers listed so far that are not offered (untrusted and unconfigured, refused)."""
        with self._lock:
            return [w for server in self.configs for w in self._withheld.get(server, [])]

    def _restarted(self, server: str, reason: str) -> None:
        calling = _CALLING.get()
        detail: dict[str, Any] = {"server": server, "reason": reason,
                                  "restarts": self.connections[server].restarts}
        if calling is not None:
            detail.update(step_id=calling[1], skill=calling[2])
        if self.audit is not None:
            self.audit(calling[0] if calling else None, "mcp_server_restarted", detail)

    def close(self) -> None:
        """Close every connection (stdio servers are stopped) and the loop."""
        for connection in self.connections.values():
            connection.close()
        self._connector.close()

    # ------------------------------------------------------------------ tools into skills
    def _to_skills(self, server: str, listing: Listing) -> tuple[dict[str, Skill], list[Withheld]]:
        cfg = self.configs[server]
        target = self.connections[server].target
        identity = {"server": server, "transport": target.transport, "target": target.describe(),
                    "name": listing.server_name, "version": listing.server_version}
        skills: dict[str, Skill] = {}
        withheld: list[Withheld] = []
        for tool in listing.tools:
            if cfg.include is not None and tool.name not in cfg.include:
                continue
            skill_id = f"{server}.{skill_name(tool.name)}"
            if skill_id in skills:
                raise McpError(f"MCP server {server!r}: tools {tool.name!r} and "
                               f"{self.tools[skill_id].tool!r} both become skill {skill_id}", "protocol")
            override = cfg.tools.get(tool.name)
            risk, idempotent, source = risk_for(tool.annotations, override, trusted=cfg.trusted)
            if source != "config" and not cfg.trusted and cfg.untrusted_tools == "refuse":
                withheld.append(Withheld(server, tool.name, "the server is not trusted and the MCP file gives no "
                                                            "risk for the tool (untrusted_tools: refuse)"))
                continue
            described = tool.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"meta"})
            digest = content_hash({"mcp": identity, "tool": described, "trusted": cfg.trusted,
                                   "config": override.model_dump(mode="json") if override else None})
            try:
                manifest = Manifest(
                    id=skill_id, version=_version(listing.server_version), kind="mcp",
                    description=tool.description or tool.title or tool.name,
                    input_schema=tool.input_schema, risk=risk, idempotent=idempotent,
                    timeout_s=(override.timeout_s if override and override.timeout_s else cfg.timeout_s),
                    retry=(override.retry if override and override.retry else RetryPolicy()),
                    breaker=(override.breaker if override and override.breaker else BreakerSettings()))
            except ValidationError as exc:
                raise McpError(f"MCP server {server!r}: tool {tool.name!r} cannot be a skill: "
                               f"{exc.errors()[0]['msg']}", "protocol") from exc
            skills[skill_id] = Skill(manifest, digest, self.path, _through_the_server)
            self.tools[skill_id] = McpTool(server, tool.name, source)
        return skills, withheld


def _through_the_server(args: dict[str, Any], ctx: Any) -> Any:
    raise RuntimeError("an MCP tool runs through the tool controller, not here")


def _version(reported: str) -> str:
    """The server's version as a skill version (0.0.0 when it reports none or an unusual one)."""
    return reported if re.match(r"^\d+\.\d+(\.\d+)?([-+][A-Za-z0-9.]+)?$", reported or "") else "0.0.0"


def _target(name: str, cfg: ServerConfig) -> Target:
    if cfg.url is not None:
        return Target(name, url=cfg.url)
    assert cfg.command is not None
    return Target(name, command=cfg.command, env=tuple(sorted(cfg.env.items())), cwd=cfg.cwd)


class McpCalls:
    """The executor of `mcp` skills: the tool, called on its server, after checking that the server still
    lists it as the Run pinned it."""

    def __init__(self, servers: McpServers, record_cost: Callable[[CostTrace], None] | None = None) -> None:
        self.servers = servers
        self.record_cost = record_cost

    def __call__(self, call: Attempt) -> Any:
        skill, ctx = call.skill, call.ctx
        tool = self.servers.tools[skill.id]
        connection = self.servers.connections[tool.server]
        call.info["isolation"] = f"mcp:{connection.target.transport}"
        token = _CALLING.set((ctx.run_id, ctx.step_id, skill.id))
        try:
            current = self.servers.refresh(tool.server).get(skill.id)
            if current is None or current.manifest_hash != skill.manifest_hash:
                raise ToolCallError("manifest_changed", f"{skill.id}: the MCP server {tool.server!r} no longer "
                                    "lists the tool as this Run pinned it (its tool list or schema changed)")
            result = connection.call(tool.tool, dict(call.arguments), call.timeout)
        except McpError as exc:
            if exc.kind == "timeout":
                raise call.late() from exc
            # a broken connection may have lost a call the server made: only an idempotent tool is retried
            raise ToolCallError(f"mcp_{exc.kind}", str(exc),
                                retryable=exc.kind == "unavailable" or skill.manifest.idempotent) from exc
        finally:
            _CALLING.reset(token)
        self._record(call, tool)
        return _output(skill.id, result)

    def _record(self, call: Attempt, tool: McpTool) -> None:
        if self.record_cost is None:
            return
        ctx, price = call.ctx, self.servers.configs[tool.server].price_per_call_usd
        self.record_cost(CostTrace(run_id=ctx.run_id, source=f"mcp:{tool.server}:{tool.tool}", api_calls=1,
                                   usd=price, unit_price={"per_call": price}, tenant_id=ctx.tenant_id,
                                   user_id=ctx.user_id, skill_id=call.skill.id))


def _output(skill_id: str, result: mcp_types.CallToolResult) -> Any:
    """A tool's result as the step's output: its structured content, else its text (and other content)."""
    texts = [c.text for c in result.content if isinstance(c, mcp_types.TextContent)]
    if result.is_error:
        raise ToolCallError("mcp_tool_error", f"{skill_id}: {' '.join(texts)[:2_000] or 'the tool reported an error'}")
    if result.structured_content is not None:
        return dict(result.structured_content)
    out: dict[str, Any] = {"text": "\n".join(texts)}
    other = [c.model_dump(mode="json", by_alias=True, exclude_none=True)
             for c in result.content if not isinstance(c, mcp_types.TextContent)]
    if other:
        out["content"] = other
    return out

