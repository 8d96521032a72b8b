"""The incident drill's dangerous actions, by the three roles, at both doors (issue 36, point 6), in real headless
Chromium and through the REST API: an override with the gate shut, a forced rollback, "It did not occur", a
coverage waiver, a fence and a mismatch review — each done once in the console and once through the API by the
role that may (after a refused first try in the console that shows its error beside the field), and tried by a
role that may not, which the console does not offer and refuses when posted anyway, and the API answers 403.
The assertions are the audit rows: exactly one per action done, with its principal and its reason, none for a
refusal."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from claims.models import AuditEntry, Effect
from rollout.models import CoverageWaiver, Mismatch, Rollback, StageChange
from rollout.tasks import gate_check
from tests.e2e.test_console import log_in, ui_user
from tests.support.actors import ensure_default_namespace, make_actor
from tests.support.rollout import stage_of

pytestmark = [pytest.mark.django_db(transaction=True)]

DANGEROUS = [
    "namespace_set_stage", "rollback_start", "effect_reconcile", "coverage_waive", "epoch_fence", "mismatch_review",
]  # fmt: skip


def _unknown_effect(operator, worker) -> str:
    claim = worker.claim(operator.create().json()["task_id"]).json()
    key = worker.prepare(claim, "charge", {"amount": 5}).json()["effect_id"]
    assert worker.outcome(claim, key, "UNKNOWN").json()["state"] == "UNKNOWN"
    return key


def _mismatch(operator, ns: str) -> int:
    from claims import clock

    return Mismatch.objects.create(
        namespace=ns, task_id=operator.create(namespace=ns).json()["task_id"], operation="complete",
        api="legacy", legacy={}, v1={}, reason="STALE_COMMIT_ACCEPTED", at=clock.now(),
    ).pk  # fmt: skip


def _posted_anyway(page, live_server, path: str, form: dict) -> tuple[int, str]:
    """What the console answers a form the page did not offer, posted with the user's own session and token."""
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    answer = page.request.post(
        f"{live_server.url}{path}",
        form={**form, "csrfmiddlewaretoken": token},
        headers={"Referer": f"{live_server.url}/"},
    )
    return answer.status, answer.text()


def test_three_roles_do_each_dangerous_action_at_the_console_and_the_api(page, live_server, settings):
    ensure_default_namespace()
    api = {role: make_actor(f"api-{role}", role) for role in ("reviewer", "operator", "oncall")}
    operator, worker = api["operator"], make_actor("w-drill", "worker")
    for ui, api_ns, stage in (("w-ui", "w-api", "V1_READS"), ("o-ui", "o-api", "SHADOW"), ("r-ui", "r-api", "V1_WRITES"), ("f-ui", "f-api", "V1_ONLY")):  # fmt: skip
        for name in (ui, api_ns):
            assert operator.post("/namespaces", {"name": name, "stage": stage}).status_code == 201
    shut = {ns: _mismatch(operator, ns) for ns in ("o-ui", "o-api")}  # an open mismatch shuts SHADOW's gate
    reviewed = {ns: _mismatch(operator, ns) for ns in ("w-ui", "w-api")}
    for ns in ("w-ui", "o-ui"):
        gate_check(ns)
    effects = {door: _unknown_effect(operator, worker) for door in ("ui", "api")}
    for username, role in (("rita", "reviewer"), ("olivia", "operator"), ("oscar", "oncall")):
        ui_user(username, role)

    # --- the reviewer: reviews a mismatch; is offered nothing else, and is refused what it posts anyway -----------
    log_in(page, live_server, "rita")
    page.goto(f"{live_server.url}/mismatches/{reviewed['w-ui']}")
    page.get_by_role("button", name="Mark explained").click()  # no note: refused beside the field
    expect(page.locator("#review-note-error")).to_contain_text("note")
    page.locator("#review-note").fill("the drill's injected writer")
    page.get_by_role("button", name="Mark explained").click()
    expect(page.locator("#status")).to_have_text("EXPLAINED")
    page.goto(f"{live_server.url}/ns/w-ui/")
    assert (
        page.get_by_role("button", name="Waive effect").count() == 0
        and page.locator("#header-fence").count() == 0
    )
    refused_ui = [
        _posted_anyway(page, live_server, "/ns/w-ui/waive", {"point": "effect", "reason": "x", "confirm_waive": "on"}),
        _posted_anyway(page, live_server, f"/effects/{effects['ui']}/reconcile", {"observed": "NOT_OCCURRED", "reason": "x", "confirm": "on"}),
    ]  # fmt: skip
    page.get_by_role("button", name="Log out").click()

    # --- the operator: waives a point, records "It did not occur"; no override, no rollback, no fence ------------
    log_in(page, live_server, "olivia")
    page.goto(f"{live_server.url}/ns/w-ui/")
    page.get_by_label("Reason to waive effect").fill("this namespace sends no effects")
    page.get_by_role("button", name="Waive effect").click()  # the consequence not ticked: refused beside it
    expect(page.locator("#waive-effect-confirm-waive-error")).to_be_visible()
    assert (
        page.get_by_label("Reason to waive effect").input_value() == "this namespace sends no effects"
    )  # kept
    page.get_by_label("The gate then passes with no effect traffic seen in this stage").check()
    page.get_by_role("button", name="Waive effect").click()
    expect(page.locator(".messages")).to_contain_text(
        "Waived: the coverage gate passes without effect traffic"
    )
    page.goto(f"{live_server.url}/effects/")
    row = page.get_by_role("row").filter(has_text=effects["ui"])
    row.locator("summary", has_text="It did not occur").click()
    row.get_by_label("Reason (what you checked at the target)").fill("the payments API has no such charge")
    row.get_by_label("I checked: it did not happen").check()
    row.get_by_role("button", name="Record: it did not occur").click()
    expect(page.locator(".messages")).to_contain_text("did not occur. It is PREPARED again")
    page.goto(f"{live_server.url}/ns/o-ui/advance")
    assert page.get_by_label("Override the shut gate (oncall)").count() == 0
    page.goto(f"{live_server.url}/ns/r-ui/")
    assert page.locator("#rollback-form").count() == 0
    refused_ui += [
        _posted_anyway(page, live_server, "/ns/o-ui/advance", {"to_stage": "V1_READS", "override": "on", "confirm_override": "on", "reason": "x"}),
        _posted_anyway(page, live_server, "/ns/r-ui/rollback", {"to_stage": "V1_READS", "reason": "x", "force": "on", "confirm_force": "on"}),
        _posted_anyway(page, live_server, "/ns/f-ui/fence", {"reason": "x", "confirm": "f-ui"}),
    ]  # fmt: skip
    page.get_by_role("button", name="Log out").click()

    # --- on-call: overrides the shut gate, forces a rollback, fences ----------------------------------------------
    log_in(page, live_server, "oscar")
    page.goto(f"{live_server.url}/ns/o-ui/advance")
    page.get_by_label("Override the shut gate (oncall)").check()
    page.get_by_label("I understand: advance with the gate shut").check()
    page.get_by_role("button", name="Confirm: advance to V1_READS").click()  # no reason: refused beside it
    expect(page.locator("#advance-reason-error")).to_contain_text("An override needs a reason")
    page.locator("#advance-reason").fill("drill: the mismatch is the injected writer")
    page.get_by_role("button", name="Confirm: advance to V1_READS").click()
    expect(page.locator(".messages")).to_contain_text("Overridden: advanced to V1_READS with the gate shut")
    page.goto(f"{live_server.url}/ns/r-ui/")
    page.locator("#rollback-to").select_option("V1_READS")
    page.locator("#rollback-reason").fill("drill: winners differ in V1_WRITES")
    page.get_by_label("Finish without a clean drain").check()
    page.get_by_label("I understand: if I force it, in-flight work is lost").check()
    page.get_by_role("button", name="Roll back").click()
    expect(page.locator(".messages")).to_contain_text("olled back to V1_READS")
    page.goto(f"{live_server.url}/ns/f-ui/fence")
    page.locator("#fence-reason").fill("drill: a stale writer")
    page.locator("#fence-confirm").fill("f-ui")
    page.get_by_role("button", name="Fence the epoch").click()
    expect(page.locator("#epoch")).to_have_text("2")

    # --- the API: the same actions by the role that may, and by one that may not ------------------------------
    done_api = [
        api["reviewer"].post(f"/mismatches/{reviewed['w-api']}/review", {"status": "EXPLAINED", "note": "api: injected writer"}),
        operator.post("/namespaces/w-api/coverage/waive", {"point": "effect", "reason": "api: no effects here"}),
        operator.post(f"/effects/{effects['api']}/reconcile", {"observed": "NOT_OCCURRED", "reason": "api: no such charge"}),
        api["oncall"].post("/namespaces/o-api/rollout/advance", {"to_stage": "V1_READS", "override": True, "reason": "api: drill override"}),
        api["oncall"].post("/namespaces/r-api/rollout/rollback", {"to_stage": "V1_READS", "force": True, "reason": "api: drill rollback"}),
        api["oncall"].post("/namespaces/f-api/fence", {"reason": "api: drill fence"}),
    ]  # fmt: skip
    refused_api = [
        worker.post(f"/mismatches/{shut['o-api']}/review", {"status": "EXPLAINED", "note": "x"}),
        api["reviewer"].post("/namespaces/w-api/coverage/waive", {"point": "claim", "reason": "x"}),
        api["reviewer"].post(f"/effects/{effects['api']}/reconcile", {"observed": "OCCURRED", "reason": "x"}),
        operator.post("/namespaces/o-ui/rollout/advance", {"to_stage": "V1_WRITES", "override": True, "reason": "x"}),
        operator.post("/namespaces/r-api/rollout/rollback", {"to_stage": "SHADOW", "reason": "x"}),
        operator.post("/namespaces/f-api/fence", {"reason": "x"}),
    ]  # fmt: skip

    assert [status for status, _ in refused_ui] == [403] * 5, refused_ui
    assert all("Not allowed" in text for _, text in refused_ui)
    assert [r.status_code for r in done_api] == [200, 201, 200, 200, 200, 200], [r.content for r in done_api]
    assert [r.status_code for r in refused_api] == [403] * 6
    audited = sorted(
        AuditEntry.objects.filter(action__in=DANGEROUS).values_list("action", "principal", "reason")
    )
    assert audited == sorted([
        ("mismatch_review", "ui:rita", "the drill's injected writer"),
        ("coverage_waive", "ui:olivia", "this namespace sends no effects"),
        ("effect_reconcile", "ui:olivia", "the payments API has no such charge"),
        ("namespace_set_stage", "ui:oscar", "drill: the mismatch is the injected writer"),
        ("rollback_start", "ui:oscar", "drill: winners differ in V1_WRITES"),
        ("epoch_fence", "ui:oscar", "drill: a stale writer"),
        ("mismatch_review", "api-reviewer", "api: injected writer"),
        ("coverage_waive", "api-operator", "api: no effects here"),
        ("effect_reconcile", "api-operator", "api: no such charge"),
        ("namespace_set_stage", "api-oncall", "api: drill override"),
        ("rollback_start", "api-oncall", "api: drill rollback"),
        ("epoch_fence", "api-oncall", "api: drill fence"),
        # a rollback fences its namespace and moves its stage: each its own audit row, by the same principal
        ("epoch_fence", "ui:oscar", "rollback: drill: winners differ in V1_WRITES"),
        ("namespace_set_stage", "ui:oscar", "rollback: drill: winners differ in V1_WRITES"),
        ("epoch_fence", "api-oncall", "rollback: api: drill rollback"),
        ("namespace_set_stage", "api-oncall", "rollback: api: drill rollback"),
    ])  # fmt: skip
    assert {stage_of(ns) for ns in ("o-ui", "o-api", "r-ui", "r-api")} == {"V1_READS"}
    assert (
        StageChange.objects.filter(override=True).count() == 2
        and Rollback.objects.filter(reason__startswith="drill").exists()
    )
    assert CoverageWaiver.objects.count() == 2 and set(Effect.objects.values_list("state", flat=True)) == {
        "PREPARED"
    }
    assert set(Mismatch.objects.filter(pk__in=reviewed.values()).values_list("status", flat=True)) == {
        "EXPLAINED"
    }
