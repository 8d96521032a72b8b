"""One rulebook for every door (issue 36, part 1): the dangerous actions' rules live in the service that performs
them, so the console, the REST API and the CLI refuse the same bad input alike — with nothing written and nothing
audited — and a reviewer role that reviews mismatches and does nothing else, at every door."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from claims import clock
from claims.models import AuditEntry, Namespace, Token
from rollout.models import CoverageWaiver, Mismatch, Rollback, StageChange
from tests.support.actors import make_actor
from tests.support.console import login

pytestmark = pytest.mark.django_db

BLANK = ["", "   ", "\t\n"]


def _stage(ns: str) -> str:
    return Namespace.objects.select_related("rollout").get(name=ns).rollout.stage


@pytest.fixture
def people(db):
    return make_actor("olivia-operator", "operator"), make_actor("oscar-oncall", "oncall")


def _nothing_audited(action: str) -> bool:
    return not AuditEntry.objects.filter(action=action).exists()


@pytest.mark.parametrize("reason", BLANK)
def test_an_override_without_a_real_reason_is_refused_at_the_console_and_the_api(people, reason):
    operator, oncall = people
    assert operator.post("/namespaces", {"name": "shut", "stage": "LEGACY"}).status_code == 201
    ui = login("oncall")

    console = ui.post(
        "/ns/shut/advance",
        {"to_stage": "SHADOW", "override": "on", "confirm_override": "on", "reason": reason},
    )
    api = oncall.post(
        "/namespaces/shut/rollout/advance", {"to_stage": "SHADOW", "override": True, "reason": reason}
    )

    assert console.status_code == 400 and api.status_code == 400 and "reason" in api.json()["errors"]
    assert b'id="advance-reason-error"' in console.content  # beside the field
    assert _stage("shut") == "LEGACY" and not StageChange.objects.filter(namespace="shut").exists()


def test_an_override_with_a_reason_is_called_an_override(people):
    operator, _ = people
    assert operator.post("/namespaces", {"name": "shut", "stage": "LEGACY"}).status_code == 201
    page = login("oncall").post(
        "/ns/shut/advance",
        {"to_stage": "SHADOW", "override": "on", "confirm_override": "on", "reason": "drill: legacy workers gone"},
        follow=True,
    )  # fmt: skip
    assert b"Overridden: advanced to SHADOW with the gate shut" in page.content
    change = StageChange.objects.get(namespace="shut")
    assert change.override and change.reason == "drill: legacy workers gone"


@pytest.mark.parametrize("reason", BLANK)
@pytest.mark.parametrize("force", [False, True])
def test_a_rollback_needs_a_real_reason_at_every_door_forced_or_not(people, reason, force):
    operator, oncall = people
    assert operator.post("/namespaces", {"name": "back", "stage": "V1_READS"}).status_code == 201
    before = Namespace.objects.get(name="back").scheduler_epoch

    form = {
        "to_stage": "SHADOW",
        "reason": reason,
        **({"force": "on", "confirm_force": "on"} if force else {}),
    }
    console = login("oncall").post("/ns/back/rollback", form)
    api = oncall.post(
        "/namespaces/back/rollout/rollback", {"to_stage": "SHADOW", "reason": reason, "force": force}
    )

    assert console.status_code == 400 and api.status_code == 400
    assert not Rollback.objects.exists() and Namespace.objects.get(name="back").scheduler_epoch == before
    assert _stage("back") == "V1_READS" and _nothing_audited("rollback")


def test_a_coverage_waiver_is_refused_where_the_gate_has_no_coverage_condition(people):
    operator, _ = people
    assert operator.post("/namespaces", {"name": "early", "stage": "LEGACY"}).status_code == 201
    console = login("operator").post(
        "/ns/early/waive", {"point": "effect", "reason": "no effects here", "confirm_waive": "on"}
    )
    api = operator.post("/namespaces/early/coverage/waive", {"point": "effect", "reason": "no effects here"})
    blank = operator.post("/namespaces/early/coverage/waive", {"point": "effect", "reason": "   "})

    assert (
        console.status_code == 302
        and api.status_code == 409
        and api.json()["outcome"] == "INVALID_TRANSITION"
    )
    assert blank.status_code == 400
    assert not CoverageWaiver.objects.exists() and _nothing_audited("coverage_waive")


def test_re_reviewing_an_explained_mismatch_is_said_and_changes_nothing(people):
    operator, _ = people
    assert operator.post("/namespaces", {"name": "shady", "stage": "SHADOW"}).status_code == 201
    task_id = operator.create(namespace="shady").json()["task_id"]
    mismatch = Mismatch.objects.create(
        namespace="shady", task_id=task_id, operation="complete", api="legacy", legacy={}, v1={},
        reason="STALE_COMMIT_ACCEPTED", at=clock.now(),
    )  # fmt: skip
    first = operator.post(f"/mismatches/{mismatch.pk}/review", {"status": "EXPLAINED", "note": "the drill"})
    again = operator.post(f"/mismatches/{mismatch.pk}/review", {"status": "EXPLAINED", "note": "other words"})
    blank = operator.post(f"/mismatches/{mismatch.pk}/review", {"status": "EXPLAINED", "note": "   "})

    assert first.status_code == 200 and again.status_code == 409 and "already EXPLAINED" in str(again.json())
    assert blank.status_code == 400
    assert AuditEntry.objects.filter(action="mismatch_review").count() == 1
    assert Mismatch.objects.get().note == "the drill"


def test_a_reviewer_reviews_mismatches_and_nothing_else_at_every_door(people):
    operator, _ = people
    reviewer = make_actor("rita-reviewer", "reviewer")
    assert operator.post("/namespaces", {"name": "shady", "stage": "SHADOW"}).status_code == 201
    task_id = operator.create(namespace="shady").json()["task_id"]
    mismatches = [
        Mismatch.objects.create(
            namespace="shady",
            task_id=task_id,
            operation="complete",
            api="legacy",
            legacy={},
            v1={},
            reason="STALE_COMMIT_ACCEPTED",
            at=clock.now(),
        )  # fmt: skip
        for _ in range(3)
    ]
    ui = login("reviewer")

    api_review = reviewer.post(
        f"/mismatches/{mismatches[0].pk}/review", {"status": "EXPLAINED", "note": "expected"}
    )
    ui_bulk = ui.post(
        "/ns/shady/mismatches/review",
        {"ids": [m.pk for m in mismatches], "status": "EXPLAINED", "note": "the drill's injected writer"},
    )
    refused_api = [
        reviewer.post("/namespaces/shady/rollout/advance", {"to_stage": "V1_READS", "reason": "x"}),
        reviewer.post("/namespaces/shady/fence", {"reason": "x"}),
        reviewer.post("/namespaces/shady/rollout/rollback", {"to_stage": "LEGACY", "reason": "x"}),
        reviewer.post("/namespaces", {"name": "mine"}),
        reviewer.get("/audit"),
    ]
    refused_ui = [
        ui.post("/ns/shady/advance", {"to_stage": "V1_READS"}),
        ui.post("/ns/shady/rollback", {"to_stage": "LEGACY", "reason": "x"}),
        ui.post("/ns/shady/waive", {"point": "effect", "reason": "x"}),
        ui.get("/audit/"),
    ]

    assert api_review.status_code == 200 and ui_bulk.status_code == 302
    assert [r.status_code for r in refused_api] == [403] * 5
    assert [r.status_code for r in refused_ui] == [403] * 4
    assert set(Mismatch.objects.values_list("status", flat=True)) == {"EXPLAINED"}
    reviewers = AuditEntry.objects.filter(action="mismatch_review").values_list("principal", flat=True)
    assert sorted(set(reviewers)) == ["rita-reviewer", "ui:reviewer-user"]
    assert _stage("shady") == "SHADOW" and Namespace.objects.get(name="shady").scheduler_epoch == 1
    page = ui.get("/ns/shady/mismatches")
    assert page.status_code == 200 and b"Review the selected mismatches" in page.content


def test_revoking_a_token_needs_a_reason_and_an_operator_and_is_audited(people):
    worker = make_actor("agent-z", "worker")
    prefix = worker.token[:10]
    with pytest.raises(CommandError, match="reason"):
        call_command("revoke_token", prefix, "--reason", "   ", "--as", "olivia-operator")
    with pytest.raises(CommandError, match="operator"):
        call_command("revoke_token", prefix, "--reason", "leaked", "--as", "agent-z")
    assert Token.objects.get(principal__name="agent-z").revoked_at is None
    with pytest.raises(CommandError, match="whoever holds it stops working.*pass --yes"):
        call_command("revoke_token", prefix, "--reason", "leaked in a log", "--as", "olivia-operator")
    assert Token.objects.get(principal__name="agent-z").revoked_at is None  # not confirmed: nothing done
    call_command("revoke_token", prefix, "--reason", "leaked in a log", "--as", "olivia-operator", "--yes")
    assert Token.objects.get(principal__name="agent-z").revoked_at is not None
    entry = AuditEntry.objects.get(action="token_revoke")
    assert (entry.principal, entry.reason) == ("olivia-operator", "leaked in a log")


def test_a_bulk_review_can_take_every_mismatch_the_filter_shows_and_keeps_the_filter(people):
    """Issue 36: no select-all, and the filter was dropped after a bulk review."""
    operator, _ = people
    assert operator.post("/namespaces", {"name": "shady", "stage": "SHADOW"}).status_code == 201
    task_id = operator.create(namespace="shady").json()["task_id"]
    for reason in ("STALE_COMMIT_ACCEPTED", "STALE_COMMIT_ACCEPTED", "WINNER_DIFFERS"):
        Mismatch.objects.create(
            namespace="shady", task_id=task_id, operation="complete", api="legacy", legacy={}, v1={},
            reason=reason, at=clock.now(),
        )  # fmt: skip
    ui = login("reviewer")
    page = ui.get("/ns/shady/mismatches", {"reason": "STALE_COMMIT_ACCEPTED"})
    assert (
        b'name="f_reason" value="STALE_COMMIT_ACCEPTED"' in page.content and b'id="all-shown"' in page.content
    )

    done = ui.post(
        "/ns/shady/mismatches/review",
        {
            "all_shown": "on",
            "f_reason": "STALE_COMMIT_ACCEPTED",
            "status": "EXPLAINED",
            "note": "the drill's writer",
        },
    )

    assert done.status_code == 302 and done["Location"] == "/ns/shady/mismatches?reason=STALE_COMMIT_ACCEPTED"
    assert sorted(Mismatch.objects.values_list("reason", "status")) == [
        ("STALE_COMMIT_ACCEPTED", "EXPLAINED"),
        ("STALE_COMMIT_ACCEPTED", "EXPLAINED"),
        ("WINNER_DIFFERS", "OPEN"),
    ]


def test_a_resnapshot_says_what_it_gives_up_and_needs_a_confirmation(people):
    """Issue 36: a resnapshot never judges the legacy decisions in its gap. The command says so and does nothing
    until it is confirmed (``--yes``, or typed at a terminal); its rules come first."""
    with pytest.raises(CommandError, match="never judged.*pass --yes"):
        call_command("legacy_observe", "--resnapshot", "the slot was lost", "--as", "oscar-oncall")
    with pytest.raises(CommandError, match="oncall"):
        call_command(
            "legacy_observe", "--resnapshot", "the slot was lost", "--as", "olivia-operator", "--yes"
        )
    assert _nothing_audited("observer_resnapshot")
