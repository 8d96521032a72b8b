"""The gateway's console page: the downstream MCP servers and the per-tool rules (operators change them; every change
audited), and the recent tool calls with their tool, arguments' digest and answer."""

from __future__ import annotations

import json
from collections.abc import Callable

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from claims import clock
from claims.errors import ClaimError, Invalid
from claims.services.principals import ui_role
from claims.ui import LIVE_REFRESH_SECONDS, acting, refused, role_required

from . import selectors, services
from .models import Occurred, SlotFrom, ToolKind, Transport


@role_required("viewer")
def gateway_page(request: HttpRequest) -> HttpResponse:
    ns = request.GET.get("ns", "").strip()
    return render(
        request,
        "gateway/gateway.html",
        {
            "ui_role": ui_role(request.user),
            "fixed": [d for d in selectors.downstreams() if d.source == "settings"],
            "rows": selectors.downstream_rows(),
            "rules": selectors.rules(),
            "calls": selectors.tool_call_rows(namespace=ns or None),
            "ns": ns,
            "kinds": ToolKind.values,
            "slot_froms": SlotFrom.values,
            "occurreds": Occurred.values,
            "transports": Transport.values,
            "taken_at": clock.now(),
            "refresh_seconds": LIVE_REFRESH_SECONDS,
        },
    )


def _json_field(raw: str, field: str, kind: type) -> object:
    if not raw.strip():
        return kind()
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise Invalid({field: [f"Not JSON: {exc}"]}) from None
    if not isinstance(value, kind):
        raise Invalid({field: [f"Must be a JSON {'object' if kind is dict else 'list'}."]})
    return value


def _seconds(raw: str) -> float:
    try:
        return float(raw or 30)
    except ValueError:
        raise Invalid({"call_timeout_seconds": ["Must be a number of seconds."]}) from None


def _saved(request: HttpRequest, form: str, save: Callable[[], object], done: str) -> HttpResponse:
    """One change sent by the page's ``form``: saved (the service audits it) and said, or refused with the form kept."""
    try:
        save()
    except ClaimError as exc:
        return refused(request, exc, form=form, again=lambda: gateway_page(request), back=_back)
    messages.success(request, done)
    return _back()


def _back() -> HttpResponse:
    return redirect("console:gateway")


@require_POST
@role_required("operator")
def downstream_save(request: HttpRequest) -> HttpResponse:
    post = request.POST
    name = post.get("name", "").strip()

    def save() -> object:
        return services.downstream_save(
            principal=acting(request),
            name=name,
            prefix=post.get("prefix", "").strip() or name,
            transport=post.get("transport", ""),
            command=[line.strip() for line in post.get("command", "").splitlines() if line.strip()],
            env=_json_field(post.get("env", ""), "env", dict),
            url=post.get("url", "").strip(),
            call_timeout_seconds=_seconds(post.get("call_timeout_seconds", "")),
            trust_annotations=post.get("trust_annotations") == "on",
            enabled=post.get("enabled", "on") == "on",
        )

    return _saved(request, "downstream", save, f"Saved server {name}.")


@require_POST
@role_required("operator")
def tool_rule_set(request: HttpRequest) -> HttpResponse:
    post = request.POST
    downstream, tool = post.get("downstream", "").strip(), post.get("tool", "").strip()

    def save() -> object:
        return services.tool_rule_set(
            principal=acting(request),
            downstream=downstream,
            tool=tool,
            kind=post.get("kind", ToolKind.EFFECT),
            record_reads=post.get("record_reads") == "on",
            slot_from=post.get("slot_from", SlotFrom.CANONICAL),
            slot_argument=post.get("slot_argument", "").strip(),
            query_tool=post.get("query_tool", "").strip(),
            query_arguments=_json_field(post.get("query_arguments", ""), "query_arguments", dict),
            occurred_if=post.get("occurred_if", Occurred.NOT_ERROR),
            occurred_text=post.get("occurred_text", ""),
        )

    return _saved(request, "rule", save, f"Saved the rule of {downstream}/{tool}.")
