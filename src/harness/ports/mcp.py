"""The port of MCP servers (harness.skills.mcp): where a server is, what it lists, and a connection to it.

The SDK stays at the edge (harness.adapters.mcp_client implements McpConnector); the composition root
(harness.config) hands one to McpServers. A tool and a call's result are the protocol's own value types
(the `mcp_types` package): a skill's manifest hash is computed over the tool exactly as the server listed it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

from harness.domain.errors import HarnessError

if TYPE_CHECKING:
    import mcp_types

Kind = Literal["unavailable", "closed", "timeout", "protocol"]


class McpError(HarnessError):
    """An MCP server could not be reached or did not answer: `kind` says how ("unavailable": it could not
    be started or connected to; "closed": the connection broke during the request; "timeout"; "protocol":
    it answered with a JSON-RPC error)."""

    def __init__(self, message: str, kind: Kind) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Target:
    """Where a server is: a command run over stdio, or a streamable HTTP URL."""

    name: str
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    url: str | None = None

    @property
    def transport(self) -> Literal["stdio", "http"]:
        """How the client talks to it."""
        return "http" if self.url else "stdio"

    def describe(self) -> str:
        """The server as a person reads it."""
        return self.url or " ".join(self.command)


@dataclass(frozen=True)
class Listing:
    """What a server said about itself and its tools, at one moment."""

    server_name: str
    server_version: str
    tools: tuple[mcp_types.Tool, ...]


class McpConnection(Protocol):
    """One server's connection: opened at first use, reopened after the server died, closed on request."""

    @property
    def target(self) -> Target:
        """The server it talks to."""
        ...

    @property
    def restarts(self) -> int:
        """How many times the connection was opened again after it had broken."""
        ...

    def listing(self, timeout: float) -> Listing:
        """The server's identity and its tools, asked now (McpError when it cannot answer)."""
        ...

    def call(self, tool: str, arguments: dict[str, Any], timeout: float) -> mcp_types.CallToolResult:
        """Call one tool; its own error result (isError) is returned, not raised."""
        ...

    def close(self) -> None:
        """Close the connection (a stdio server is stopped); the next use opens it again."""
        ...


class McpConnector(Protocol):
    """Opens the connections of one process (they share one event loop) and closes them all."""

    def connect(self, target: Target, *, connect_timeout_s: float,
                on_restart: Callable[[str], None] | None) -> McpConnection:
        """A connection to `target` (opened at first use); `on_restart` is told why it was reopened."""
        ...

    def close(self) -> None:
        """Stop what the connections share (close the connections first)."""
        ...
