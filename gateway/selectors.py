"""What the gateway reads: the downstream servers (settings and console), each tool's rule, the claim an attempt
holds, and the tool calls recorded for the console."""

from __future__ import annotations

import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef

from claims import clock
from claims.models import Attempt, DispatchIntent, Effect

from .models import Downstream, Occurred, SlotFrom, ToolCall, ToolKind, ToolRule, Transport

SEPARATOR = "__"  # an exposed tool is <prefix>__<tool>


@dataclass(frozen=True)
class DownstreamConfig:
    name: str
    prefix: str
    transport: str
    command: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    url: str = ""
    call_timeout_seconds: float = 30.0
    trust_annotations: bool = False
    source: str = "console"  # or "settings": read-only in the console


@dataclass(frozen=True)
class Rule:
    kind: str = ToolKind.EFFECT
    record_reads: bool = False
    slot_from: str = SlotFrom.CANONICAL
    slot_argument: str = ""
    query_tool: str = ""
    query_arguments: dict[str, Any] = field(default_factory=dict)
    occurred_if: str = Occurred.NOT_ERROR
    occurred_text: str = ""
    source: str = "default"


def _from_settings(entry: dict[str, Any]) -> DownstreamConfig:
    return DownstreamConfig(
        name=entry["name"],
        prefix=entry["name"] if entry.get("prefix") is None else entry["prefix"],
        transport=entry.get("transport", Transport.STDIO if entry.get("command") else Transport.HTTP),
        command=tuple(entry.get("command", ())),
        env=tuple(sorted(entry.get("env", {}).items())),
        url=entry.get("url", ""),
        call_timeout_seconds=float(entry.get("call_timeout_seconds", 30.0)),
        trust_annotations=bool(entry.get("trust_annotations", False)),
        source="settings",
    )


class _Cached:
    """The console's downstream rows and tool rules, read at most every ``MCP_CONFIG_CACHE_SECONDS`` per process: a
    tool call pays no query for them. A change made in this process is seen at once (``forget``), in the others
    within the bound."""

    def __init__(self) -> None:
        self.at = -1e9
        self.rows: list[Downstream] = []
        self.rules: dict[tuple[str, str], ToolRule] = {}

    def fresh(self) -> _Cached:
        if time.monotonic() - self.at > settings.MCP_CONFIG_CACHE_SECONDS:
            self.rows = list(Downstream.objects.filter(enabled=True).order_by("name"))
            self.rules = {(r.downstream, r.tool): r for r in ToolRule.objects.all()}
            self.at = time.monotonic()
        return self

    def forget(self) -> None:
        self.at = -1e9


_cached = _Cached()
forget = _cached.forget


def downstreams() -> list[DownstreamConfig]:
    """Every enabled downstream: those in settings (``MCP_DOWNSTREAMS``), then those made in the console."""
    found = [_from_settings(entry) for entry in settings.MCP_DOWNSTREAMS]
    taken = {d.name for d in found} | {d.prefix for d in found if d.prefix}
    for row in _cached.fresh().rows:
        if row.name in taken or row.prefix in taken:
            continue  # settings win: a console row cannot shadow what the deployment fixed
        found.append(
            DownstreamConfig(
                name=row.name,
                prefix=row.prefix,
                transport=row.transport,
                command=tuple(row.command),
                env=tuple(sorted(row.env.items())),
                url=row.url,
                call_timeout_seconds=row.call_timeout_seconds,
                trust_annotations=row.trust_annotations,
            )
        )
    return found


def downstream_rows() -> list[Downstream]:
    return list(Downstream.objects.order_by("name"))


def exposed_name(config: DownstreamConfig, tool: str) -> str:
    """``<prefix>__<tool>``; a server with an empty prefix shows its tools under their own names."""
    return f"{config.prefix}{SEPARATOR}{tool}" if config.prefix else tool


def route_cached(exposed: str) -> tuple[DownstreamConfig, str] | None | bool:  # False: cold
    """``route`` without a query when the cache is warm; False when it is cold (the caller asks the database)."""
    if time.monotonic() - _cached.at > settings.MCP_CONFIG_CACHE_SECONDS:
        return False
    return route(exposed)


def route(exposed: str) -> tuple[DownstreamConfig, str] | None:
    """The downstream and its own tool name behind an exposed name: ``<prefix>__<tool>``, else a tool of the server
    with an empty prefix."""
    configs = downstreams()
    prefix, sep, tool = exposed.partition(SEPARATOR)
    if sep and tool:
        for config in configs:
            if config.prefix and config.prefix == prefix:
                return config, tool
    for config in configs:
        if not config.prefix:
            return config, exposed
    return None


def rule_for(downstream: str, tool: str, *, read_only_hint: bool = False, trusted: bool = False) -> Rule:
    """The operator's rule for a tool (the console's, else settings' ``MCP_TOOL_RULES``); with none, an EFFECT with a
    CANONICAL slot — or READ_ONLY when the server is trusted and annotates the tool readOnlyHint."""
    row = _cached.fresh().rules.get((downstream, tool))
    if row is not None:
        return Rule(
            kind=row.kind,
            record_reads=row.record_reads,
            slot_from=row.slot_from,
            slot_argument=row.slot_argument,
            query_tool=row.query_tool,
            query_arguments=row.query_arguments,
            occurred_if=row.occurred_if,
            occurred_text=row.occurred_text,
            source="console",
        )
    for entry in settings.MCP_TOOL_RULES:
        if entry.get("downstream") == downstream and entry.get("tool") == tool:
            values = {k: v for k, v in entry.items() if k not in ("downstream", "tool")}
            return Rule(**values, source="settings")
    if trusted and read_only_hint:
        return Rule(kind=ToolKind.READ_ONLY, source="annotation")
    return Rule()


def rules() -> list[ToolRule]:
    return list(ToolRule.objects.order_by("downstream", "tool"))


@dataclass(frozen=True)
class HeldClaim:
    attempt_id: uuid.UUID
    task_id: str
    namespace_id: int
    owner_id: str
    claim_generation: int
    scheduler_epoch: int


_ATTEMPTS_KEPT = 4096
_attempts: OrderedDict[uuid.UUID, HeldClaim] = OrderedDict()
_attempts_lock = threading.Lock()  # the database hops run in a pool of threads


def attempt_claim(attempt_id: uuid.UUID) -> HeldClaim | None:
    """The claim an attempt was granted: what the gateway presents at the effect acceptance point for a call
    made through ``/mcp/attempts/{attempt_id}``. Whether that claim still holds is decided there, under its locks.
    These fields of an attempt never change once it is granted, so each process keeps the last few thousand it read
    (a repeat of a call, or the next call of the same attempt, pays no query for them)."""
    with _attempts_lock:
        held = _attempts.get(attempt_id)
        if held is not None:
            _attempts.move_to_end(attempt_id)
            return held
    row = (
        Attempt.objects.filter(pk=attempt_id)
        .values_list("task_id", "namespace_id", "owner_id", "claim_generation", "scheduler_epoch")
        .first()
    )
    if row is None:
        return None
    held = HeldClaim(attempt_id, *row)
    with _attempts_lock:
        _attempts[attempt_id] = held
        while len(_attempts) > _ATTEMPTS_KEPT:
            _attempts.popitem(last=False)
    return held


def tool_call(effect_id: str) -> ToolCall | None:
    return ToolCall.objects.filter(pk=effect_id).first()


def effect_state(effect_id: str) -> tuple[str, bool]:
    """The effect's state and whether a delivery of it is in flight (a dispatch intent PENDING or SENDING)."""
    in_flight = DispatchIntent.objects.filter(effect_id=OuterRef("pk"), state__in=["PENDING", "SENDING"])
    row = Effect.objects.filter(pk=effect_id).values_list("state", Exists(in_flight)).first()
    return (row[0], bool(row[1])) if row else ("", False)


def delivery_silence(effect_id: str) -> tuple[bool, float]:
    """Whether a delivery of the effect is in flight, and how long its sender has been silent (since its last
    progress, else since the send began)."""
    row = (
        DispatchIntent.objects.filter(effect_id=effect_id, state__in=["PENDING", "SENDING"])
        .values_list("heard_at", "sending_at", "created_at")
        .first()
    )
    if row is None:
        return False, 0.0
    since = row[0] or row[1] or row[2]
    return True, (clock.now() - since).total_seconds()


def tool_calls(*, namespace: str | None = None, limit: int = 200) -> list[ToolCall]:
    calls = ToolCall.objects.select_related("effect", "namespace").order_by("-created_at")
    if namespace:
        calls = calls.filter(namespace__name=namespace)
    return list(calls[:limit])


def _deliveries(effect_ids: list[str]) -> dict[str, tuple[int, bool]]:
    """Per effect, from its dispatch intents: how many sends began that may have reached the server (an intent is
    recorded SENDING before the first byte leaves; only a send that could not connect is known not to have), and
    whether one is in flight now."""
    found: dict[str, tuple[int, bool]] = {}
    for effect_id, state, not_sent in DispatchIntent.objects.filter(effect_id__in=effect_ids).values_list(
        "effect_id", "state", "not_sent"
    ):
        sent, in_flight = found.get(effect_id, (0, False))
        began = state in ("SENDING", "DELIVERED") and not not_sent
        found[effect_id] = (sent + began, in_flight or state == "SENDING")
    return found


def _answer(call: ToolCall, state: str, delivery: tuple[int, bool]) -> str:
    """What the console says of a tool call: sent or not, from the ledger's record that a send began (the intent),
    not from the answers recorded."""
    sent, in_flight = delivery
    if sent == 0:
        return "not sent"
    sends = "sent once" if sent == 1 else f"sent {sent}×"
    if in_flight:
        return f"{sends}, no answer yet (it may have acted)"
    if state == "UNKNOWN":
        return f"{sends}, no answer (UNKNOWN: it may have acted)"
    if call.answered_at is None or (call.result is None and state != "COMMITTED"):
        return f"{sends}, no answer recorded"
    return f"{sends}, {'tool error' if call.is_error else 'answered'}"


def tool_call_labels(effect_ids: list[str] | Any) -> dict[str, dict[str, Any]]:
    """What the console's effect lists show beside an effect that is a tool call (claims.ui.effect_labels)."""
    rows = list(ToolCall.objects.filter(pk__in=list(effect_ids)).select_related("effect"))
    deliveries = _deliveries([row.effect_id for row in rows])
    return {
        row.effect_id: {
            "tool": f"{row.downstream}/{row.tool}",
            "arguments_digest": row.arguments_digest,
            "answer": _answer(row, row.effect.state, deliveries.get(row.effect_id, (0, False))),
            "sent": deliveries.get(row.effect_id, (0, False))[0] > 0,
        }
        for row in rows
    }


def tool_call_rows(*, namespace: str | None = None, limit: int = 200) -> list[dict[str, Any]]:
    """The gateway page's recent tool calls: tool, arguments' digest, the effect's state and the answer."""
    rows = tool_calls(namespace=namespace, limit=limit)
    deliveries = _deliveries([row.effect_id for row in rows])
    return [
        {
            "call": row,
            "state": row.effect.state,
            "answer": _answer(row, row.effect.state, deliveries.get(row.effect_id, (0, False))),
            "task_id": row.effect.task_id,
        }
        for row in rows
    ]


def configuration() -> dict[str, list[dict[str, Any]]]:
    """Every server and rule, as the API and ``claimctl gateway list`` show them (environment values left out)."""
    servers = [
        {**_fields(_from_settings(entry)), "enabled": True, "source": "settings"}
        for entry in settings.MCP_DOWNSTREAMS
    ]
    for row in downstream_rows():
        servers.append(
            {
                "name": row.name,
                "prefix": row.prefix,
                "transport": row.transport,
                "command": list(row.command),
                "env": sorted(row.env),
                "url": row.url,
                "call_timeout_seconds": row.call_timeout_seconds,
                "trust_annotations": row.trust_annotations,
                "enabled": row.enabled,
                "source": "api",
            }
        )
    defaults = Rule().__dict__
    found = [
        {**{k: v for k, v in defaults.items() if k != "source"}, **entry, "source": "settings"}
        for entry in settings.MCP_TOOL_RULES
    ]
    found += [
        {
            **{k: getattr(row, k) for k in defaults if k != "source"},
            "downstream": row.downstream,
            "tool": row.tool,
            "source": "api",
        }
        for row in rules()
    ]
    return {"downstreams": servers, "rules": found}


def _fields(config: DownstreamConfig) -> dict[str, Any]:
    return {
        "name": config.name,
        "prefix": config.prefix,
        "transport": config.transport,
        "command": list(config.command),
        "env": sorted(k for k, _ in config.env),
        "url": config.url,
        "call_timeout_seconds": config.call_timeout_seconds,
        "trust_annotations": config.trust_annotations,
    }
