"""The gateway's connections to downstream MCP servers, one per server per app-server process, opened on first use and
opened again after they break. A stdio server is a child process of the app server; a Streamable HTTP server is
reached with the SDK's client. Every session is entered and left by one holder task in the lifespan's task group
(anyio's rule: a context is left by the task that entered it); calls use the session from any task.

Downstreams come and go, and the pool opens a new session by itself:
- a stdio child that died is seen before the next call is sent (its output stream is closed), and started again;
- a Streamable HTTP server that answers 404 for our ``Mcp-Session-Id`` (it restarted, or dropped the session) ran
  nothing: the MCP transport says the client starts a new session, and the call is sent again on it, once;
- a server that cannot be connected to was sent nothing (the connection failed before the first byte of the
  request): the call is answered UNAVAILABLE and the session is opened again on the next call.
The last tool list each server gave is kept, so its tools stay listed while it is down (a call gets UNAVAILABLE).

Every call carries its effect id as the idempotency key (``_meta`` ``dev.claim-control-plane/idempotency_key``, and
an ``Idempotency-Key`` header on Streamable HTTP), identical on every resend of the effect.

The call's timeout measures silence, not duration: each progress notification from the server starts it again.

What a call's failure means for the ledger (``Outcome.state``):
- the tool answered: COMMITTED, or FAILED when it says ``isError`` (a definite answer: it reports it did not do it);
- a JSON-RPC error that says the call was not run (invalid params, no such method): FAILED;
- nothing was sent (no connection could be made, no session): FAILED with ``sent=False``, answered UNAVAILABLE;
- a timeout, a connection lost mid-call, any other error: UNKNOWN — the server may have acted.
"""

from __future__ import annotations

import contextvars
import logging
import os
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, cast

import anyio
import httpx2
import mcp_types
from anyio.abc import TaskGroup
from django.conf import settings
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from claims.models import EffectState

from .selectors import DownstreamConfig

log = logging.getLogger(__name__)

IDEMPOTENCY_META_KEY = "dev.claim-control-plane/idempotency_key"

# JSON-RPC errors after which the call certainly did not run.
_NOT_RUN = {
    mcp_types.INVALID_PARAMS,
    mcp_types.METHOD_NOT_FOUND,
    mcp_types.INVALID_REQUEST,
    mcp_types.PARSE_ERROR,
}
# The pool's own code for "no connection could be made": the transport answers it for a request it never sent.
_UNREACHABLE = -32050

Heard = Callable[[], Awaitable[None]]


class Unavailable(Exception):
    """The server cannot be reached now: nothing was sent to it."""


@dataclass
class Outcome:
    state: str  # COMMITTED | FAILED | UNKNOWN
    result: dict[str, Any] | None  # the CallToolResult as JSON, when the tool answered
    external_ref: str
    error: str = ""
    unavailable: bool = False  # nothing was sent

    @property
    def sent(self) -> bool:
        return not self.unavailable


@dataclass
class _Send:
    """One request in flight through the HTTP transport, seen by it through a context variable (the SDK runs each
    request's POST in the sender's context)."""

    key: str = ""
    unreachable: bool = False  # no connection: not a byte of the request left
    session_lost: bool = False  # 404 for our session: the server ran nothing


_SEND: contextvars.ContextVar[_Send | None] = contextvars.ContextVar("gateway_send", default=None)


class _Transport(httpx2.AsyncBaseTransport):
    """httpx's transport with what the pool needs to know and say: the idempotency key as a header, a connection
    that could not be made answered as a JSON-RPC error (the SDK's writer would otherwise stop on the exception),
    and a 404 for the session marked as a lost session."""

    def __init__(self) -> None:
        self._inner = httpx2.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        send = _SEND.get()
        if send is not None and send.key:
            request.headers["Idempotency-Key"] = send.key
        try:
            response = await self._inner.handle_async_request(request)
        except (httpx2.ConnectError, httpx2.ConnectTimeout) as exc:
            if send is not None:
                send.unreachable = True
            error = {"code": _UNREACHABLE, "message": f"cannot connect: {exc}"[:300]}
            return httpx2.Response(503, json={"jsonrpc": "2.0", "id": None, "error": error}, request=request)
        if response.status_code == 404 and request.headers.get("mcp-session-id") and send is not None:
            send.session_lost = True
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


@dataclass
class _Held:
    config: DownstreamConfig
    ready: anyio.Event = field(default_factory=anyio.Event)
    closing: anyio.Event = field(default_factory=anyio.Event)
    session: ClientSession | None = None
    read: Any = None  # the session's incoming stream: closed when a stdio child has died
    error: BaseException | None = None

    def alive(self) -> bool:
        if self.session is None:
            return False
        statistics = getattr(self.read, "statistics", None)
        return statistics is None or statistics().open_send_streams > 0


@dataclass
class _Tools:
    tools: list[types.Tool]
    at: float


class Pool:
    """This process's downstream sessions. ``start(task_group)`` in the lifespan; ``call`` and ``list_tools`` from any
    request."""

    TOOLS_TTL = 30.0

    def __init__(self) -> None:
        self._tg: TaskGroup | None = None
        self._held: dict[DownstreamConfig, _Held] = {}
        self._tools: dict[
            DownstreamConfig, _Tools
        ] = {}  # the last list each server gave, kept while it is down
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
                        httpx2.AsyncClient(transport=_Transport(), timeout=config.call_timeout_seconds + 5)
                    )
                    read, write = await stack.enter_async_context(
                        streamable_http_client(
                            config.url, http_client=http, max_sse_event_size=settings.MCP_MAX_ANSWER_BYTES
                        )
                    )
                session = await stack.enter_async_context(ClientSession(read, write))
                with anyio.fail_after(max(config.call_timeout_seconds, 10)):
                    await session.initialize()
                held.session, held.read = session, read
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
        """A live session with the server, opened (again) when there is none or the one held has died. Raises
        ``Unavailable`` when none can be opened: nothing was sent."""
        async with self._lock:
            held = self._held.get(config)
            if held is not None and held.ready.is_set() and not held.alive():
                self._drop(config)  # a stdio child that died: seen before anything is sent to it
                held = None
            if held is None:
                if self._tg is None:
                    raise RuntimeError(
                        "the gateway's downstream pool was not started (the ASGI lifespan starts it)"
                    )
                held = self._held[config] = _Held(config)
                self._tg.start_soon(self._hold, held)
        await held.ready.wait()
        if held.session is None:
            raise Unavailable(f"cannot reach {config.name}: {_reason(held.error)}")
        return held.session

    def _drop(self, config: DownstreamConfig, session: ClientSession | None = None) -> None:
        """Close the held session (only ``session`` when given: another call may have opened a new one already)."""
        held = self._held.get(config)
        if held is None or (session is not None and held.session is not session):
            return
        self._held.pop(config, None)
        held.closing.set()

    def known_tools(self, config: DownstreamConfig) -> list[types.Tool] | None:
        """The last tool list the server gave (None: it never answered one)."""
        known = self._tools.get(config)
        return known.tools if known is not None else None

    async def list_tools(self, config: DownstreamConfig, *, fresh: bool = False) -> list[types.Tool]:
        """The server's tools, cached ``TOOLS_TTL``; the last list it gave while it cannot be asked. Raises
        ``Unavailable`` only for a server that never answered one."""
        known = self._tools.get(config)
        if known is not None and not fresh and anyio.current_time() - known.at < self.TOOLS_TTL:
            return known.tools
        try:
            tools = await self._list(config)
        except Exception as exc:  # noqa: BLE001 - a server down keeps its last list
            if known is not None:
                return known.tools
            raise Unavailable(f"cannot list the tools of {config.name}: {_reason(exc)}") from None
        self._tools[config] = _Tools(tools, anyio.current_time())
        return tools

    async def _list(self, config: DownstreamConfig) -> list[types.Tool]:
        for again in (True, False):
            session = await self._session(config)
            send = _Send()
            token = _SEND.set(send)
            try:
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
                            return tools
            except Exception:
                self._drop(config, session)
                if not (again and (send.session_lost or send.unreachable)):
                    raise
            finally:
                _SEND.reset(token)
        raise AssertionError("unreachable")

    async def call(
        self,
        config: DownstreamConfig,
        tool: str,
        arguments: dict[str, Any],
        *,
        key: str = "",
        progress: Any = None,
        heard: Heard | None = None,
    ) -> Outcome:
        """One call, with ``key`` as its idempotency key; never raises (see the module for what each failure means).
        Its timeout measures silence: every progress notification starts it again, and calls ``heard``."""
        for again in (True, False):
            try:
                session = await self._session(config)
            except Exception as exc:  # noqa: BLE001 - nothing was sent
                return _unsent(exc)
            send = _Send(key=key)
            outcome = await self._send(config, session, tool, arguments, send, progress, heard)
            if send.session_lost or send.unreachable:
                # The server ran nothing: its session is gone (it restarted) or it could not be reached.
                self._drop(config, session)
                if again and send.session_lost:
                    continue  # a new session, and the call on it, once
                return Outcome(EffectState.FAILED, None, "unavailable", outcome.error, unavailable=True)
            return outcome
        raise AssertionError("unreachable")

    async def _send(
        self,
        config: DownstreamConfig,
        session: ClientSession,
        tool: str,
        arguments: dict[str, Any],
        send: _Send,
        forward: Any,
        heard: Heard | None,
    ) -> Outcome:
        silence = config.call_timeout_seconds
        token = _SEND.set(send)
        try:
            with anyio.CancelScope() as scope:
                scope.deadline = anyio.current_time() + silence

                async def on_progress(progress: float, total: float | None, message: str | None) -> None:
                    # The server is alive: silence starts again.
                    scope.deadline = anyio.current_time() + silence
                    if heard is not None:
                        await heard()
                    if forward is not None:
                        await forward(progress, total, message)

                result = await session.call_tool(
                    tool,
                    arguments,
                    progress_callback=on_progress,
                    meta=_meta(send.key),
                )
            if scope.cancelled_caught:
                return Outcome(EffectState.UNKNOWN, None, "timeout", f"silent for {silence} s")
        except MCPError as exc:
            if exc.code == _UNREACHABLE or send.session_lost:
                return Outcome(EffectState.FAILED, None, "unavailable", exc.message[:500], unavailable=True)
            if exc.code in _NOT_RUN:
                return Outcome(EffectState.FAILED, None, f"jsonrpc:{exc.code}", exc.message[:500])
            if exc.code == mcp_types.CONNECTION_CLOSED:
                self._drop(config, session)
            return Outcome(EffectState.UNKNOWN, None, f"jsonrpc:{exc.code}", exc.message[:500])
        except Exception as exc:  # noqa: BLE001 - a broken connection mid-call: the server may have acted
            self._drop(config, session)
            return Outcome(EffectState.UNKNOWN, None, "connection", f"{type(exc).__name__}: {exc}"[:500])
        finally:
            _SEND.reset(token)
        body = result.model_dump(by_alias=True, exclude_none=True, mode="json")
        body.pop("resultType", None)
        if result.is_error:
            return Outcome(EffectState.FAILED, body, "isError")
        return Outcome(EffectState.COMMITTED, body, "ok")


def _meta(key: str) -> mcp_types.RequestParamsMeta | None:
    meta: dict[str, Any] = {IDEMPOTENCY_META_KEY: key}
    return cast(mcp_types.RequestParamsMeta, meta) if key else None


def _reason(exc: BaseException | None) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _reason(exc.exceptions[0])
    return f"{exc}"[:300] or type(exc).__name__


def _unsent(exc: BaseException) -> Outcome:
    return Outcome(EffectState.FAILED, None, "unavailable", f"{exc}"[:500], unavailable=True)


pool = Pool()
