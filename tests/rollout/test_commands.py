"""The terminal mirrors of the rollout API: rollout status|advance|rollback, fence, drain_check."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from claims.models import AuditEntry, Namespace
from tests.support.rollout import stage_of


def run(*args) -> dict:
    out = StringIO()
    call_command(*args, stdout=out)
    return json.loads(out.getvalue())


def test_status_advance_with_override_and_rollback(operator, oncall):
    operator.post("/namespaces", {"name": "cli", "stage": "LEGACY"})

    status = run("rollout", "status", "cli")
    with pytest.raises(CommandError, match="GATE_NOT_MET"):
        run("rollout", "advance", "cli", "--to", "SHADOW", "--as", operator.name)
    with pytest.raises(CommandError, match="FORBIDDEN"):
        run(
            "rollout",
            "advance",
            "cli",
            "--to",
            "SHADOW",
            "--override",
            "--reason",
            "x",
            "--as",
            operator.name,
        )
    forced = run(
        "rollout", "advance", "cli", "--to", "SHADOW", "--override", "--reason", "pilot", "--as", oncall.name
    )
    back = run("rollout", "rollback", "cli", "--to", "LEGACY", "--reason", "oops", "--as", oncall.name)

    assert status["stage"] == "LEGACY" and status["gate"]["holds"] is False
    assert forced["stage"] == "SHADOW"
    assert back["outcome"] == "ROLLED_BACK" and back["scheduler_epoch"] == 2
    ns = Namespace.objects.get(name="cli")
    assert (stage_of(ns.name), ns.claims_paused) == ("LEGACY", True)
    assert AuditEntry.objects.filter(action="namespace_set_stage", principal="oscar-oncall").count() == 2


def test_fence_and_drain_check(oncall, operator):
    fenced = run("fence", "default", "--reason", "drill", "--as", oncall.name)
    drained = run("drain_check", "default")

    assert fenced["scheduler_epoch"] == 2 and fenced["self_check"]["ok"] is True
    assert drained["clean"] is True
    with pytest.raises(CommandError, match="fencing is oncall's"):
        run("fence", "default", "--reason", "x", "--as", operator.name)
