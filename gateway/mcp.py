"""The gateway's MCP server: the official SDK's low-level ``Server`` behind Streamable HTTP, stateless (any app server
behind the balancer answers any request), mounted beside Django in ``controlplane.asgi`` whose lifespan runs it.

- ``POST /mcp/attempts/{attempt_id}``: every ``tools/call`` is an effect of that attempt's claim. ``POST /mcp``
  takes the attempt from ``_meta`` (``dev.claim-control-plane/attempt_id``) instead — some agent frameworks drop
  ``_meta``, so the endpoint is the way every client can use.
- ``Authorization: Bearer <worker token>`` on every request (401 without, 403 for a token that is not a worker's).
  The token is never sent downstream.
- ``tools/list``: the tools of every configured downstream server as ``<prefix>__<tool>``, with their annotations.

A call's steps are ``gateway.services.calls``; this module does their network I/O. Once a call has an intent to
send recorded, it is finished — sent, answered and recorded — even when the client hangs up (a shielded scope):
the client's retry then gets the recorded answer.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from importlib import metadata
from typing import Any
from urllib.parse import urlsplit

import anyio
import mcp_types
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections
from django.http.request import split_domain_port, validate_host
from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.exceptions import MCPError

from claims.auth import principal_for_token
from claims.models import EffectState, Principal, Role

from . import selectors
from .downstream import Outcome, Unavailable, pool
from .models import Occurred
from .selectors import DownstreamConfig
from .services import (
    Call,
    Step,
    call_begin,
    call_heard,
    call_lost,
    call_reconcile,
    call_record,
    call_start,
    call_waited,
)
from .services.answers import refusal
from .services.calls import lost_after_seconds

log = logging.getLogger(__name__)

WAIT_POLL_SECONDS = 0.1
Progress = Callable[[float, "float | None", "str | None"], Awaitable[None]]


async def db(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn`` in a worker thread with its own database connection, tidied as Django tidies one around a request."""

    def run() -> Any:
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return await sync_to_async(run, thread_sensitive=False)()


@dataclass(frozen=True)
class Gate:
    principal: Principal
    attempt_id: uuid.UUID | None


async def list_tools(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
    tools: list[types.Tool] = []
    for config in await db(selectors.downstreams):
        try:
            found = await pool.list_tools(config)
        except Exception as exc:  # noqa: BLE001 - one server down hides its tools, not everyone's
            log.warning("tools/list: %s unavailable: %s", config.name, exc)
            continue
        tools.extend(
            tool.model_copy(update={"name": selectors.exposed_name(config, tool.name)}) for tool in found
        )
    return types.ListToolsResult(tools=tools)


async def list_resources(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListResourcesResult:
    """The gateway proxies tools only: no resources (an empty list for clients that list everything on connect)."""
    return types.ListResourcesResult(resources=[])


async def list_prompts(ctx: Any, params: types.PaginatedRequestParams | None) -> types.ListPromptsResult:
    """The gateway proxies tools only: no prompts."""
    return types.ListPromptsResult(prompts=[])


async def _routed(name: str) -> tuple[DownstreamConfig, str] | None:
    cached = selectors.route_cached(name)
    if cached is False:
        routed: tuple[DownstreamConfig, str] | None = await db(selectors.route, name)
        return routed
    return cached if isinstance(cached, tuple) else None


async def _tool(config: DownstreamConfig, tool: str) -> types.Tool | None:
    """The server's tool of that name, from its list (asked again once when the tool is not on the list held).
    Raises ``Unavailable`` when the server never gave a list."""
    for fresh in (False, True):
        listed = await pool.list_tools(config, fresh=fresh)
        found = next((t for t in listed if t.name == tool), None)
        if found is not None:
            return found
    return None


async def call_tool(ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
    gate: Gate = ctx.request.scope["claim_gateway"]
    raw: Any = params.meta
    meta: dict[str, Any] | None = (
        raw if isinstance(raw, dict) or raw is None else raw.model_dump(by_alias=True)
    )
    annotations: dict[str, Any] = {}
    routed = await _routed(params.name)
    if routed is not None:
        # Nothing is recorded for a tool the server does not have, or a server that cannot tell us what it has.
        config, tool_name = routed
        try:
            tool = await _tool(config, tool_name)
        except Unavailable as exc:
            return _result(refusal("UNAVAILABLE", f"{exc}. Nothing was recorded or sent"))
        if tool is None:
            return _result(
                refusal("NOT_FOUND", f"No tool {params.name!r}: {config.name} has no tool {tool_name!r}")
            )
        if config.trust_annotations and tool.annotations is not None:
            annotations = tool.annotations.model_dump(by_alias=True, exclude_none=True)
    try:
        started = await db(
            call_start,
            principal=gate.principal,
            attempt_id=gate.attempt_id,
            exposed=params.name,
            arguments=params.arguments,
            meta=meta,
            annotations=annotations,
        )
    except (
        Exception
    ):  # its transaction rolled back: nothing recorded, nothing sent; no detail leaks to the caller
        log.exception("tools/call %s failed before anything was sent", params.name)
        raise MCPError(mcp_types.INTERNAL_ERROR, "internal error: nothing was recorded or sent") from None
    if isinstance(started, Step):
        return _result(started.result)
    plan, first = started
    progress = _progress_forwarder(ctx, meta)
    # From here the ledger may commit to sending: a client that hangs up does not stop the call half-way.
    with anyio.CancelScope(shield=True):
        body = await drive(plan, progress, first)
    return _result(body)


def _progress_forwarder(ctx: Any, meta: dict[str, Any] | None) -> Progress | None:
    """The downstream's progress notifications, sent on to the caller under the caller's own progress token."""
    given = meta or {}
    token = next((given[key] for key in ("progressToken", "progress_token") if key in given), None)
    if token is None:
        return None

    async def forward(progress: float, total: float | None, message: str | None) -> None:
        with contextlib.suppress(
            Exception
        ):  # a caller gone or a closed stream loses a notification, not the call
            await ctx.session.send_progress_notification(
                token, progress, total, message, related_request_id=ctx.request_id
            )

    return forward


def _result(body: dict[str, Any] | None) -> types.CallToolResult:
    return types.CallToolResult.model_validate(body or {"content": [], "isError": True})


async def drive(call: Call, progress: Progress | None = None, first: Step | None = None) -> dict[str, Any]:
    """The steps of one call (``gateway.services.calls``) until it has an answer."""
    for _ in range(4):
        step, first = first or await db(call_begin, call), None
        if step.kind == "ANSWER":
            return step.result or {}
        if step.kind == "SEND":
            return await _send(call, step, progress)
        if step.kind == "WAIT":
            if not await _settled(step.effect_id, call):
                if await db(call_lost, step=step, downstream=call.downstream):
                    continue
                return refusal(
                    "IN_FLIGHT", f"Effect {step.effect_id} is being sent.", effect_id=step.effect_id
                )
            waited = await db(call_waited, step)
            if waited is not None:
                return waited.result or {}
            continue
        refused = await _reconcile(call, step)
        if refused is not None:
            return refused
    return refusal("IN_FLIGHT", "The call did not settle; its effect is being decided by another call.")


def _heartbeat(step: Step) -> Callable[[], Awaitable[None]] | None:
    """A long call's sign of life, written to its intent at most every ``MCP_HEARD_EVERY_SECONDS``: while the server
    reports progress, no repeat of the call records it lost."""
    if not step.dispatch_id:
        return None
    last = anyio.current_time()

    async def heard() -> None:
        nonlocal last
        if anyio.current_time() - last >= settings.MCP_HEARD_EVERY_SECONDS:
            last = anyio.current_time()
            await db(call_heard, step)

    return heard


async def _send(call: Call, step: Step, progress: Progress | None = None) -> dict[str, Any]:
    outcome = await pool.call(
        call.downstream,
        call.tool,
        call.arguments,
        key=step.effect_id,
        progress=progress,
        heard=_heartbeat(step),
    )
    if not call.passes_through:
        await db(
            call_record,
            step=step,
            state=outcome.state,
            result=outcome.result,
            external_ref=outcome.external_ref,
            error=outcome.error,
            sent=outcome.sent,
        )
    return _answer(outcome, step.effect_id)


def _answer(outcome: Outcome, effect_id: str) -> dict[str, Any]:
    if outcome.result is not None:
        return outcome.result  # the tool's own answer, isError or not
    if outcome.unavailable:
        return refusal("UNAVAILABLE", outcome.error, effect_id=effect_id)
    if outcome.state == EffectState.FAILED and outcome.external_ref.startswith("jsonrpc:"):
        # The downstream refused the request itself (bad arguments, no such tool): the same protocol error.
        raise MCPError(int(outcome.external_ref.partition(":")[2]), outcome.error)
    return refusal(
        "UNKNOWN", f"No answer from the tool ({outcome.external_ref}: {outcome.error}).", effect_id=effect_id
    )


async def _settled(effect_id: str, call: Call) -> bool:
    """Wait for another call's delivery of the effect to be recorded — for as long as its sender is heard from (a
    long call reporting progress), and no longer than it would count as lost after it went silent."""
    silent_limit = lost_after_seconds(call.downstream) + 1
    while True:
        in_flight, silent_for = await db(selectors.delivery_silence, effect_id)
        if not in_flight:
            return True
        if silent_for > silent_limit:
            return False
        await anyio.sleep(WAIT_POLL_SECONDS)


_REFERENCE = re.compile(r"^\$([A-Za-z_][A-Za-z0-9_]*)$")


def _fill(template: Any, arguments: dict[str, Any]) -> Any:
    """A query rule's arguments: "$name" is the call's argument of that name; anything else is taken as is."""
    if isinstance(template, str):
        match = _REFERENCE.match(template)
        return arguments.get(match.group(1)) if match else template
    if isinstance(template, dict):
        return {key: _fill(value, arguments) for key, value in template.items()}
    if isinstance(template, list):
        return [_fill(value, arguments) for value in template]
    return template


def _text(template: str, arguments: dict[str, Any]) -> str:
    return re.sub(
        r"\$([A-Za-z_][A-Za-z0-9_]*)", lambda m: str(arguments.get(m.group(1), m.group(0))), template
    )


async def _reconcile(call: Call, step: Step) -> dict[str, Any] | None:
    """An UNKNOWN effect: ask the server through the rule's query, record what it says. A refusal when it cannot
    be asked now (the effect stays UNKNOWN)."""
    rule = call.rule
    query = await pool.call(call.downstream, rule.query_tool, _fill(rule.query_arguments, call.arguments))
    if query.result is None:
        return refusal(
            "UNKNOWN", f"The query {rule.query_tool} could not be asked.", effect_id=step.effect_id
        )
    answered_ok = not query.result.get("isError")
    if rule.occurred_if == Occurred.TEXT_CONTAINS:
        texts = [c.get("text", "") for c in query.result.get("content", []) if c.get("type") == "text"]
        occurred = answered_ok and _text(rule.occurred_text, call.arguments) in "\n".join(texts)
    else:
        occurred = answered_ok
    return await db(
        call_reconcile,
        call,
        effect_id=step.effect_id,
        observed="OCCURRED" if occurred else "NOT_OCCURRED",
        query=f"query:{rule.query_tool}",
    )


def _version() -> str:
    try:
        return metadata.version("claim-control-plane")
    except metadata.PackageNotFoundError:  # a checkout run without installing
        return ""


server: Server[Any] = Server(
    "claim-control-plane-gateway",
    version=_version(),
    instructions=(
        "Tools of other MCP servers, each call an effect of your claim: a repeated call returns the recorded "
        "answer instead of running again; a refusal says what to do next."
    ),
    on_list_tools=list_tools,
    on_call_tool=call_tool,
    on_list_resources=list_resources,
    on_list_prompts=list_prompts,
)

_PATH = re.compile(r"^/mcp(?:/attempts/(?P<attempt>[^/]+))?/?$")


async def _plain(
    send: Any, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = json.dumps({"error": message}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            + (headers or []),
        }
    )
    await send({"type": "http.response.body", "body": body})


def _allowed_origin(headers: dict[bytes, bytes]) -> bool:
    """The Host header, and the Origin header when a browser sends one, name a host of ``ALLOWED_HOSTS`` — the check
    Django makes for its own views, made here too because the gateway is not a Django view."""
    host = headers.get(b"host", b"").decode("latin-1")
    domain, _port = split_domain_port(host)
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return False
    origin = headers.get(b"origin", b"").decode("latin-1")
    if not origin:
        return True
    origin_domain, _ = split_domain_port(urlsplit(origin).netloc)
    return bool(origin_domain) and validate_host(origin_domain, settings.ALLOWED_HOSTS)


class Gateway:
    """The ASGI application under ``/mcp``: authenticates, names the attempt, hands the request to the SDK."""

    def __init__(self) -> None:
        self.manager: StreamableHTTPSessionManager | None = None

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The lifespan's part: the SDK's session manager and the downstream pool, for the process's life."""
        self.manager = StreamableHTTPSessionManager(
            server,
            stateless=True,
            # A body the API would refuse is refused here too (413), before it is parsed.
            max_request_body_size=settings.DATA_UPLOAD_MAX_MEMORY_SIZE,
        )
        async with self.manager.run(), anyio.create_task_group() as tg:
            pool.start(tg)
            try:
                yield
            finally:
                await pool.close()
                tg.cancel_scope.cancel()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        match = _PATH.match(scope["path"])
        if match is None:
            await _plain(send, 404, "no such MCP endpoint: use /mcp/attempts/{attempt_id} or /mcp")
            return
        attempt_id: uuid.UUID | None = None
        if match["attempt"]:
            try:
                attempt_id = uuid.UUID(match["attempt"])
            except ValueError:
                await _plain(send, 404, "the attempt in the path is not a UUID")
                return
        headers = dict(scope["headers"])
        if not _allowed_origin(headers):
            # DNS rebinding: a page on another site resolving to this server is refused before anything else.
            await _plain(send, 400, "Host or Origin not allowed (ALLOWED_HOSTS)")
            return
        challenge = [(b"www-authenticate", b'Bearer realm="mcp"')]
        header = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            await _plain(send, 401, "expected 'Authorization: Bearer <worker token>'", challenge)
            return
        found = await db(principal_for_token, raw)
        if found is None:
            await _plain(send, 401, "unknown or revoked token", challenge)
            return
        principal = found[0]
        if principal.role != Role.WORKER:
            await _plain(send, 403, "the MCP gateway serves workers' tokens only")
            return
        if self.manager is None:
            await _plain(
                send, 503, "the MCP gateway is not running (served under ASGI only: claimctl serve / run)"
            )
            return
        await self.manager.handle_request(
            {**scope, "claim_gateway": Gate(principal, attempt_id)}, receive, send
        )


gateway = Gateway()
