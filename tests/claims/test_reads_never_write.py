"""Reads never write: every GET the service mounts — API, console, /metrics — leaves every row of every claim.v1
and rollout table as it was. The routes are taken from the URL resolver itself, so a GET added later is covered
too. Runs under both settings profiles (with the rollout app, and the core alone)."""

from __future__ import annotations

import re

from django.apps import apps
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

APPS = ("claims", "rollout")


def _rows() -> dict[str, list[dict]]:
    return {
        model._meta.label: list(model.objects.order_by("pk").values())
        for model in apps.get_models()
        if model._meta.app_label in APPS
    }


def _routes(patterns, prefix: str = "") -> list[str]:
    out = []
    for entry in patterns:
        if isinstance(entry, URLResolver):
            out += _routes(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            out.append(prefix + str(entry.pattern))
    return out


def _path(route: str, values: dict[str, str]) -> str:
    return "/" + re.sub(r"<(?:(\w+):)?(\w+)>", lambda m: values.get(m.group(2), "1"), route).lstrip(
        "^"
    ).rstrip("$")


def test_no_get_changes_a_row(operator, worker_a, ready_task, anonymous):
    claim = worker_a.claim(ready_task).json()
    effect_id = worker_a.prepare(claim, "slot", {"p": 1}).json()["effect_id"]
    worker_a.outcome(claim, effect_id, "UNKNOWN")
    operator.post("/resources", {"resource_key": "ledger"})
    if apps.is_installed("rollout"):
        operator.post("/namespaces", {"name": "moving", "stage": "SHADOW"})
    user = get_user_model().objects.create_user(username="reader", password="pw-123456")
    user.groups.set([Group.objects.get(name="viewer")])
    console = Client()
    assert console.login(username="reader", password="pw-123456")
    values = {
        "task_id": ready_task,
        "ns": "default",
        "effect_id": effect_id,
        "key": "ledger",
        "mismatch_id": "1",
    }
    routes = [r for r in _routes(get_resolver().url_patterns) if not r.startswith("admin/")]
    before = _rows()

    answered = {}
    for route in routes:
        path = _path(route, values)
        client = operator.client if path.startswith("/api/") else console
        answered[path] = client.get(path).status_code
        if ":ns>" in route and apps.is_installed("rollout"):
            answered[_path(route, {**values, "ns": "moving"})] = client.get(
                _path(route, {**values, "ns": "moving"})
            ).status_code
    answered["/metrics"] = anonymous.get("/metrics").status_code

    assert _rows() == before
    assert 500 not in answered.values(), answered
    assert sum(1 for code in answered.values() if code == 200) >= 12, answered
