"""The operator's configuration of the gateway: downstream MCP servers and per-tool rules, each change audited with
its principal. Settings (``MCP_DOWNSTREAMS``, ``MCP_TOOL_RULES``) add what a deployment fixes; the console cannot
change those."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import models, transaction

from claims import clock
from claims.errors import Invalid
from claims.models import Principal
from claims.services import audit

from .. import selectors
from ..models import Downstream, Occurred, SlotFrom, ToolKind, ToolRule, Transport


def _check_downstream(
    *, name: str, prefix: str, transport: str, command: list[str], url: str, timeout: float
) -> None:
    errors: dict[str, list[str]] = {}
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,60}", name or ""):
        errors["name"] = ["1 to 60 letters, digits, '-' and '_'."]
    if prefix and not prefix.replace("-", "").replace("_", "").isalnum():
        errors["prefix"] = ["Letters, digits, '-' and '_' only."]
    if "__" in prefix:
        errors["prefix"] = ["A prefix may not contain '__' (it separates the prefix from the tool)."]
    if transport not in Transport.values:
        errors["transport"] = ["Must be stdio or http."]
    elif transport == Transport.STDIO and (not command or not all(isinstance(a, str) and a for a in command)):
        errors["command"] = ["A stdio server needs its command: a list of non-empty strings."]
    elif transport == Transport.HTTP and not url.startswith(("http://", "https://")):
        errors["url"] = ["A Streamable HTTP server needs its http(s) URL."]
    if not 0 < timeout <= 600:
        errors["call_timeout_seconds"] = ["Must be more than 0 and at most 600 seconds."]
    if any(
        entry.get("name") in (name, prefix) or entry.get("prefix") in (name, prefix)
        for entry in settings.MCP_DOWNSTREAMS
    ):
        errors["name"] = ["A server of that name or prefix is fixed in settings (MCP_DOWNSTREAMS)."]
    if errors:
        raise Invalid(errors)


def downstream_save(*, principal: Principal, name: str, **server: Any) -> Downstream:
    """Create or change a downstream server (by ``name``; ``server``: the fields of ``_save_downstream``); audited."""
    with transaction.atomic(durable=True):
        return _save_downstream(principal=principal, name=name, **server)


def _save_downstream(
    *,
    principal: Principal,
    name: str,
    prefix: str,
    transport: str,
    command: list[str] | None = None,
    env: dict[str, str] | None = None,
    url: str = "",
    call_timeout_seconds: float = 30.0,
    trust_annotations: bool = False,
    enabled: bool = True,
) -> Downstream:
    command = list(command or [])
    _check_downstream(
        name=name, prefix=prefix, transport=transport, command=command, url=url, timeout=call_timeout_seconds
    )
    now = clock.now()
    if Downstream.objects.exclude(name=name).filter(prefix=prefix).exists():
        raise Invalid({"prefix": [f"Prefix {prefix!r} is another server's."]})
    values: dict[str, Any] = {
        "prefix": prefix,
        "transport": transport,
        "command": command,
        "env": dict(env or {}),
        "url": url,
        "call_timeout_seconds": call_timeout_seconds,
        "trust_annotations": trust_annotations,
        "enabled": enabled,
    }
    return _audited_save(
        Downstream,
        {"name": name},
        values,
        principal=principal,
        now=now,
        action="mcp_downstream_save",
        target=name,
        # the environment's values may be secrets: their names only
        detail={
            **{k: values[k] for k in ("prefix", "transport", "command", "url", "enabled")},
            "env": sorted(values["env"]),
        },
        on_create={"created_at": now, "created_by": principal.name},
    )


def _audited_save(
    model: type[models.Model],
    lookup: dict[str, Any],
    values: dict[str, Any],
    *,
    principal: Principal,
    now: datetime,
    action: str,
    target: str,
    detail: dict[str, Any],
    on_create: dict[str, Any] | None = None,
) -> Any:
    """One row of the gateway's configuration created or changed (``on_create``: what is set only when it is
    created), audited with its principal and whether it was created; the cached configuration forgotten at commit."""
    row, created = model._default_manager.update_or_create(
        **lookup, defaults=values, create_defaults={**values, **(on_create or {})}
    )
    audit(principal=principal, action=action, at=now, target=target, detail={"created": created, **detail})
    transaction.on_commit(selectors.forget)
    return row


def downstream_values(name: str, data: dict[str, Any]) -> dict[str, Any]:
    """A validated ``DownstreamIn`` as ``downstream_save``'s arguments (the prefix defaults to the name)."""
    return {**data, "prefix": name if data.get("prefix") is None else data["prefix"]}


def gateway_apply(
    *, principal: Principal, downstreams: list[dict[str, Any]], rules: list[dict[str, Any]]
) -> int:
    """A whole configuration (``claimctl gateway apply``), in one transaction: every server and rule saved and
    audited, or — on the first invalid one — nothing. Returns how many were saved."""
    with transaction.atomic(durable=True):
        for entry in downstreams:
            name = entry["name"]
            values = downstream_values(name, {k: v for k, v in entry.items() if k != "name"})
            try:
                _save_downstream(principal=principal, name=name, **values)
            except Invalid as exc:
                raise Invalid({f"downstreams.{name}.{k}": v for k, v in exc.errors.items()}) from None
        for entry in rules:
            try:
                _set_rule(principal=principal, **entry)
            except Invalid as exc:
                where = f"rules.{entry['downstream']}/{entry['tool']}"
                raise Invalid({f"{where}.{k}": v for k, v in exc.errors.items()}) from None
    return len(downstreams) + len(rules)


def tool_rule_set(*, principal: Principal, downstream: str, tool: str, **rule: Any) -> ToolRule:
    """Set how the gateway treats one tool (``rule``: the fields of ``_set_rule``, each defaulted); audited."""
    with transaction.atomic(durable=True):
        return _set_rule(principal=principal, downstream=downstream, tool=tool, **rule)


def _set_rule(
    *,
    principal: Principal,
    downstream: str,
    tool: str,
    kind: str = ToolKind.EFFECT,
    record_reads: bool = False,
    slot_from: str = SlotFrom.CANONICAL,
    slot_argument: str = "",
    query_tool: str = "",
    query_arguments: dict[str, Any] | None = None,
    occurred_if: str = Occurred.NOT_ERROR,
    occurred_text: str = "",
) -> ToolRule:
    errors: dict[str, list[str]] = {}
    if kind not in ToolKind.values:
        errors["kind"] = [f"Must be one of {', '.join(ToolKind.values)}."]
    if slot_from not in SlotFrom.values:
        errors["slot_from"] = [f"Must be one of {', '.join(SlotFrom.values)}."]
    if slot_from == SlotFrom.ARGUMENT and not slot_argument:
        errors["slot_argument"] = ["Name the argument the slot is taken from."]
    if occurred_if not in Occurred.values:
        errors["occurred_if"] = [f"Must be one of {', '.join(Occurred.values)}."]
    if occurred_if == Occurred.TEXT_CONTAINS and not occurred_text:
        errors["occurred_text"] = ["Give the text whose presence means the call happened."]
    if not isinstance(query_arguments or {}, dict):
        errors["query_arguments"] = ["Must be an object."]
    if not tool or not downstream:
        errors["tool"] = ["Name the server and the tool."]
    if errors:
        raise Invalid(errors)
    values = {
        "kind": kind,
        "record_reads": record_reads,
        "slot_from": slot_from,
        "slot_argument": slot_argument,
        "query_tool": query_tool,
        "query_arguments": query_arguments or {},
        "occurred_if": occurred_if,
        "occurred_text": occurred_text,
    }
    now = clock.now()
    return _audited_save(
        ToolRule,
        {"downstream": downstream, "tool": tool},
        {**values, "updated_at": now, "updated_by": principal.name},
        principal=principal,
        now=now,
        action="mcp_tool_rule_set",
        target=f"{downstream}/{tool}",
        detail=values,
    )
