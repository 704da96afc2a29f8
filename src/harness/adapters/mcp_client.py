"""MCP servers over the official `mcp` SDK (client side): one connection per server, kept by the process.

The SDK is asynchronous; the pipeline is not. Every connection of a process lives on one event loop that
runs on a daemon thread of its own (`McpLoop`); callers block on it with a timeout, so a server that hangs
costs the caller its time limit and nothing more. A connection is opened at its first use, and opened
again when the server died since (a stdio server whose pipe closed, a call that failed in transport, or
a call that timed out and left the server in an unknown state); `restarts` counts those. SDK errors are
translated here, at the edge: callers see only `McpError` (with `kind`) and the tool's own result.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any

import anyio
import httpx2
import mcp_types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from harness.pipeline import waits
from harness.ports.mcp import Listing, McpError, Target

__all__ = ["McpClient", "McpConnection", "McpLoop"]

class McpLoop:
    """The event loop every MCP connection of a process runs on, on a daemon thread started at first use."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (started now if it is not)."""
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name="mcp-loop", daemon=True)
                self._thread.start()
                self._loop = loop
            return self._loop

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float, *, switch_out: bool = False) -> Any:
        """Run `coro` on the loop and wait at most `timeout` seconds (then cancel it: TimeoutError).
        `switch_out`: a drive on a drive loop switches out meanwhile — only for a caller that holds no
        lock (another drive on the same thread would block on it for ever)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop())
        try:
            return waits.result(future, timeout) if switch_out else future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer within {timeout:.3g}s") from None

    def close(self) -> None:
        """Stop the loop and its thread (connections must be closed first)."""
        with self._lock:
            loop, thread, self._loop, self._thread = self._loop, self._thread, None, None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            loop.close()


class _Watched:
    """A stdio transport that notes when the server's output ended (it exited or crashed), so the next
    request reopens the connection before it is sent instead of failing."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.ended = False

    async def __aenter__(self) -> tuple[Any, Any]:
        read, write = await self._inner.__aenter__()
        return _WatchedRead(read, self), write

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> bool | None:
        result: bool | None = await self._inner.__aexit__(exc_type, exc, tb)
        return result


class _WatchedRead:
    def __init__(self, inner: Any, owner: _Watched) -> None:
        self._inner = inner
        self._owner = owner

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._owner.ended = True
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _WatchedRead:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _WatchedRead:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class McpConnection:
    """One server's connection: opened at first use, reopened after the server died, closed on request."""

    def __init__(self, target: Target, loop: McpLoop, *, connect_timeout_s: float = 30.0,
                 on_restart: Callable[[str], None] | None = None) -> None:
        self.target = target
        #: told why, each time a broken connection is opened again
        self.on_restart = on_restart
        self.connect_timeout_s = connect_timeout_s
        #: how many times the connection was opened again after it had broken
        self.restarts = 0
        self._loop = loop
        self._lock = threading.Lock()
        self._client: Client | None = None
        self._watch: _Watched | None = None
        self._stop: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._broken: str | None = None
        self._opened = False

    # ------------------------------------------------------------------ use
    def listing(self, timeout: float) -> Listing:
        """The server's identity and its tools, asked now."""
        client, restarted = self._ready()
        del restarted
        info = client.server_info
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(100):  # a paginator that never ends cannot hang us
            page = self._request(client.list_tools(cursor=cursor, cache_mode="bypass"), timeout, "tools/list")
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        return Listing(server_name=info.name if info else self.target.name,
                       server_version=(info.version if info else "") or "", tools=tuple(tools))

    def call(self, tool: str, arguments: dict[str, Any], timeout: float) -> mcp_types.CallToolResult:
        """Call one tool; its own error result (isError) is returned, not raised."""
        client, _ = self._ready()
        result: mcp_types.CallToolResult = self._request(
            client.call_tool(tool, arguments, read_timeout_seconds=timeout), timeout + 1.0, f"tools/call {tool}")
        return result

    def pending_restart(self) -> str | None:
        """Why the next use will open the connection again (it broke), or None."""
        with self._lock:
            return self._why_reopen()

    # ------------------------------------------------------------------ lifecycle
    def _why_reopen(self) -> str | None:
        if not self._opened:
            return None
        if self._broken:
            return self._broken
        if self._watch is not None and self._watch.ended:
            return "the server process exited"
        if self._task is not None and self._task.done():
            return "the connection ended"
        return None

    def _ready(self) -> tuple[Client, bool]:
        with self._lock:
            reason = self._why_reopen()
            if self._client is not None and reason is None:
                return self._client, False
            if reason is not None:
                self._shut()
                self.restarts += 1
            self._open()
            if reason is not None and self.on_restart is not None:
                self.on_restart(reason)
            assert self._client is not None
            return self._client, reason is not None

    def _open(self) -> None:
        target = self.target
        if target.url:
            transport: Any = target.url
            self._watch = None
        else:
            params = StdioServerParameters(command=target.command[0], args=list(target.command[1:]),
                                           env=dict(target.env) or None, cwd=target.cwd)
            self._watch = _Watched(stdio_client(params))
            transport = self._watch
        client = Client(transport, cache=None, client_info=mcp_types.Implementation(name="harness-kernel",
                                                                                     version="0.1.0"))
        try:
            self._stop, self._task = self._loop.run(self._hold(client), self.connect_timeout_s)
        except TimeoutError as exc:
            raise McpError(f"MCP server {target.name!r} ({target.describe()}) did not answer the handshake "
                           f"within {self.connect_timeout_s:.3g}s", "unavailable") from exc
        except Exception as exc:
            raise McpError(f"MCP server {target.name!r} ({target.describe()}) could not be started or "
                           f"reached: {_reason(exc)}", "unavailable") from exc
        self._client, self._broken, self._opened = client, None, True

    @staticmethod
    async def _hold(client: Client) -> tuple[asyncio.Event, asyncio.Task[None]]:
        """Enter the client in a task of its own that holds it open until told to stop (the SDK's task
        groups must be entered and left by the same task)."""
        stop = asyncio.Event()
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def hold() -> None:
            try:
                async with client:
                    ready.set_result(None)
                    await stop.wait()
            except BaseException as exc:
                if not ready.done():
                    ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
                    return
                raise

        task = asyncio.get_running_loop().create_task(hold())
        await ready
        return stop, task

    def _request(self, coro: Coroutine[Any, Any, Any], timeout: float, what: str) -> Any:
        name = self.target.name
        try:
            return self._loop.run(coro, timeout, switch_out=True)  # no lock is held here
        except TimeoutError as exc:
            self._broken = f"a request timed out ({what})"
            raise McpError(f"MCP server {name!r}: {what} got no answer within {timeout:.3g}s", "timeout") from exc
        except MCPError as exc:
            if exc.code == mcp_types.REQUEST_TIMEOUT:
                self._broken = f"a request timed out ({what})"
                raise McpError(f"MCP server {name!r}: {what} got no answer within {timeout:.3g}s",
                               "timeout") from exc
            if exc.code == mcp_types.CONNECTION_CLOSED:
                self._broken = "the connection closed during a request"
                raise McpError(f"MCP server {name!r}: the connection closed during {what}", "closed") from exc
            raise McpError(f"MCP server {name!r}: {what} refused: {exc.error.message}", "protocol") from exc
        except (httpx2.TransportError, OSError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            self._broken = f"the transport failed ({type(exc).__name__})"
            raise McpError(f"MCP server {name!r}: {what} failed in transport: {_reason(exc)}", "closed") from exc

    def close(self) -> None:
        """Close the connection (a stdio server is stopped); the next use opens it again."""
        with self._lock:
            self._shut()
            self._opened = False

    def _shut(self) -> None:
        stop, task = self._stop, self._task
        self._client = self._stop = self._task = self._watch = None
        if stop is None or task is None:
            return

        async def finish() -> None:
            stop.set()
            try:
                await asyncio.wait_for(task, timeout=5)
            except BaseException:  # a connection already broken may not close cleanly; it is gone either way
                task.cancel()

        with contextlib.suppress(TimeoutError):
            self._loop.run(finish(), 10)


def _reason(exc: BaseException) -> str:
    """The innermost readable cause of an exception (the SDK wraps them in exception groups)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class McpClient:
    """The MCP connector of one process (harness.ports.mcp.McpConnector): every connection on one loop."""

    def __init__(self) -> None:
        self._loop = McpLoop()

    def connect(self, target: Target, *, connect_timeout_s: float,
                on_restart: Callable[[str], None] | None) -> McpConnection:
        """A connection to `target`, opened at its first use."""
        return McpConnection(target, self._loop, connect_timeout_s=connect_timeout_s, on_restart=on_restart)

    def close(self) -> None:
        """Stop the loop (the connections are closed first)."""
        self._loop.close()
