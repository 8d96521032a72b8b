"""The gateway's connections to downstream MCP servers, one per server per app-server process, opened on first use and
opened again after they break. A stdio server is a child process of the app server; a Streamable HTTP server is
reached with the SDK's client. Every session is entered and left by one holder task in the lifespan's task group
(anyio's rule: a context is left by the task that entered it); calls use the session from any task.

What a call's failure means for the ledger (``Outcome.state``):
- the tool answered: COMMITTED, or FAILED when it says ``isError`` (a definite answer: it reports it did not do it);
- a JSON-RPC error that says the call was not run (invalid params, no such method): FAILED;
- no connection could be made before sending: FAILED (nothing was sent), answered UNAVAILABLE;
- a timeout, a connection lost mid-call, any other error: UNKNOWN — the server may have acted.
"""

from __future__ import annotations

import logging
import os
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
import mcp_types
from anyio.abc import TaskGroup
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from claims.models import EffectState

from .selectors import DownstreamConfig

log = logging.getLogger(__name__)

# JSON-RPC errors after which the call certainly did not run.
_NOT_RUN = {
    mcp_types.INVALID_PARAMS,
    mcp_types.METHOD_NOT_FOUND,
    mcp_types.INVALID_REQUEST,
    mcp_types.PARSE_ERROR,
}


@dataclass
class Outcome:
    state: str  # COMMITTED | FAILED | UNKNOWN
    result: dict[str, Any] | None  # the CallToolResult as JSON, when the tool answered
    external_ref: str
    error: str = ""
    unavailable: bool = False


@dataclass
class _Held:
    config: DownstreamConfig
    ready: anyio.Event = field(default_factory=anyio.Event)
    closing: anyio.Event = field(default_factory=anyio.Event)
    session: ClientSession | None = None
    error: BaseException | None = None
    tools: list[types.Tool] | None = None
    tools_at: float = 0.0


class Pool:
    """This process's downstream sessions. ``start(task_group)`` in the lifespan; ``call`` and ``list_tools`` from any
    request."""

    TOOLS_TTL = 30.0

    def __init__(self) -> None:
        self._tg: TaskGroup | None = None
        self._held: dict[DownstreamConfig, _Held] = {}
        self._lock = anyio.Lock()

    def start(self, tg: TaskGroup) -> None:
        self._tg = tg

    async def close(self) -> None:
        for held in list(self._held.values()):
            held.closing.set()
        self._held.clear()

    async def _hold(self, held: _Held) -> None:
        config = held.config
        try:
            async with AsyncExitStack() as stack:
                if config.transport == "stdio":
                    params = StdioServerParameters(
                        command=config.command[0],
                        args=list(config.command[1:]),
                        env={**os.environ, **dict(config.env)},
                    )
                    read, write = await stack.enter_async_context(stdio_client(params))
                else:
                    http = await stack.enter_async_context(
                        httpx2.AsyncClient(timeout=config.call_timeout_seconds + 5)
                    )
                    read, write = await stack.enter_async_context(
                        streamable_http_client(config.url, http_client=http)
                    )
                session = await stack.enter_async_context(ClientSession(read, write))
                with anyio.fail_after(max(config.call_timeout_seconds, 10)):
                    await session.initialize()
                held.session = session
                held.ready.set()
                await held.closing.wait()
        except BaseException as exc:  # noqa: BLE001 - any failure to connect is the caller's answer
            held.error = exc
            if not isinstance(exc, anyio.get_cancelled_exc_class()):
                log.warning("downstream %s: %s", config.name, exc)
        finally:
            held.session = None
            held.ready.set()
            if self._held.get(config) is held:
                self._held.pop(config, None)

    async def _session(self, config: DownstreamConfig) -> ClientSession:
        async with self._lock:
            held = self._held.get(config)
            if held is None:
                if self._tg is None:
                    raise RuntimeError(
                        "the gateway's downstream pool was not started (the ASGI lifespan starts it)"
                    )
                held = self._held[config] = _Held(config)
                self._tg.start_soon(self._hold, held)
        await held.ready.wait()
        if held.session is None:
            raise ConnectionError(f"cannot reach {config.name}: {held.error}")
        return held.session

    def _drop(self, config: DownstreamConfig) -> None:
        held = self._held.pop(config, None)
        if held is not None:
            held.closing.set()

    async def list_tools(self, config: DownstreamConfig) -> list[types.Tool]:
        held = self._held.get(config)
        if (
            held is not None
            and held.tools is not None
            and anyio.current_time() - held.tools_at < self.TOOLS_TTL
        ):
            return held.tools
        session = await self._session(config)
        tools: list[types.Tool] = []
        cursor: str | None = None
        with anyio.fail_after(config.call_timeout_seconds):
            while True:
                page = await session.list_tools(
                    params=types.PaginatedRequestParams(cursor=cursor) if cursor else None
                )
                tools.extend(page.tools)
                cursor = page.next_cursor
                if not cursor:
                    break
        held = self._held.get(config)
        if held is not None:
            held.tools, held.tools_at = tools, anyio.current_time()
        return tools

    async def call(
        self, config: DownstreamConfig, tool: str, arguments: dict[str, Any], *, progress: Any = None
    ) -> Outcome:
        """One call, bounded by the server's timeout; never raises (see the module for what each failure means)."""
        try:
            session = await self._session(config)
        except Exception as exc:  # noqa: BLE001 - nothing was sent
            return Outcome(EffectState.FAILED, None, "unavailable", f"{exc}"[:500], unavailable=True)
        try:
            with anyio.fail_after(config.call_timeout_seconds):
                result = await session.call_tool(tool, arguments, progress_callback=progress)
        except TimeoutError:
            return Outcome(
                EffectState.UNKNOWN, None, "timeout", f"no answer in {config.call_timeout_seconds} s"
            )
        except MCPError as exc:
            if exc.code in _NOT_RUN:
                return Outcome(EffectState.FAILED, None, f"jsonrpc:{exc.code}", exc.message[:500])
            if exc.code == mcp_types.CONNECTION_CLOSED:
                self._drop(config)
            return Outcome(EffectState.UNKNOWN, None, f"jsonrpc:{exc.code}", exc.message[:500])
        except Exception as exc:  # noqa: BLE001 - a broken connection mid-call: the server may have acted
            self._drop(config)
            return Outcome(EffectState.UNKNOWN, None, "connection", f"{type(exc).__name__}: {exc}"[:500])
        body = result.model_dump(by_alias=True, exclude_none=True, mode="json")
        body.pop("resultType", None)
        if result.is_error:
            return Outcome(EffectState.FAILED, body, "isError")
        return Outcome(EffectState.COMMITTED, body, "ok")


pool = Pool()
