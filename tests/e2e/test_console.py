"""The operator console in a real browser: log in; walk a namespace through every stage with its gates; trigger
a fence (by keyboard) and see the epoch change; review and explain a mismatch; approve a NON_REPLAYABLE effect."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from claims.digest import digest
from claims.models import AuditEntry, Effect, Namespace
from rollout.models import Mismatch
from rollout.tasks import gate_check
from tests.support.actors import ensure_default_namespace, make_actor
from tests.support.rollout import stage_of

pytestmark = [pytest.mark.django_db(transaction=True)]


def ui_user(username: str, role: str) -> None:
    user = get_user_model().objects.create_user(username=username, password="pw-123456")
    user.groups.set([Group.objects.get_or_create(name=role)[0]])


def log_in(page, live_server, username: str) -> None:
    page.goto(f"{live_server.url}/login")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill("pw-123456")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(f"{live_server.url}/")


@pytest.fixture
def world(settings):
    ensure_default_namespace()
    settings.ROLLOUT_MIN_SAMPLES = 1
    settings.ROLLOUT_MIN_COVERAGE_SAMPLES = 5
    settings.DRAIN_INTERVAL_SECONDS = 1
    ui_user("olivia", "operator")
    ui_user("oscar", "oncall")
    return {
        "operator": make_actor("api-operator", "operator"),
        "legacy": make_actor("legacy-w", "worker", "legacy"),
        "v1": make_actor("v1-w", "worker", "v1"),
    }


def advance_in_ui(page, live_server, ns: str, to: str) -> str:
    """The advance page by its address: the namespace page offers the link only once the recorded gate holds, and
    these steps also try advances the gate refuses."""
    page.goto(f"{live_server.url}/ns/{ns}/advance?to={to}")
    page.get_by_label("Reason").fill(f"walk to {to}")
    page.get_by_role("button", name=f"Confirm: advance to {to}").click()
    return page.locator(".messages").inner_text()


def test_log_in_and_walk_a_namespace_through_every_stage(page, live_server, world, shot, db_clock):
    operator, old, new = world["operator"], world["legacy"], world["v1"]
    operator.post("/namespaces", {"name": "payments", "stage": "LEGACY"})

    page.goto(f"{live_server.url}/")
    assert "/login" in page.url
    shot(page, "01-login")
    log_in(page, live_server, "olivia")
    shot(page, "02-namespaces")

    # LEGACY → SHADOW: refused until a claim.v1 worker registers.
    assert "GATE_NOT_MET" in advance_in_ui(page, live_server, "payments", "SHADOW")
    shot(page, "03-gate-refused")
    page.goto(f"{live_server.url}/ns/payments/")
    assert page.locator("#advance-when").is_visible()  # the recorded gate is shut: no Advance for an operator
    new.post("/workers/register", {"protocol": "claim.v1", "binary_version": "2.4", "namespace": "payments"})
    gate_check("payments")  # what beat does every few seconds
    page.goto(f"{live_server.url}/ns/payments/")
    page.get_by_role("link", name="Advance to SHADOW…").click()
    shot(page, "04-advance-confirm")
    page.get_by_role("button", name="Confirm: advance to SHADOW").click()
    assert "Advanced to SHADOW" in page.locator(".messages").inner_text()

    # SHADOW → V1_READS: one compared operation is enough here.
    task_id = operator.create(namespace="payments").json()["task_id"]
    old.client.post(
        f"/api/legacy/tasks/{task_id}/claim", {"owner_id": old.name, "ttl_seconds": 30}, format="json"
    )
    assert "Advanced to V1_READS" in advance_in_ui(page, live_server, "payments", "V1_READS")

    # V1_READS → V1_WRITES: every acceptance point validated.
    for index in range(2):
        t = operator.create(namespace="payments").json()["task_id"]
        claim = new.claim(t).json()
        new.renew(claim)
        if index == 0:
            key = new.prepare(claim, "notify", {"i": index}).json()["effect_id"]
            new.outcome(claim, key, "COMMITTED")
            new.release(claim)
        else:
            new.finish(claim, {"i": index})
    old.client.post(f"/api/legacy/tasks/{task_id}/release", {"owner_id": old.name}, format="json")
    page.goto(f"{live_server.url}/ns/payments/")
    shot(page, "05-rollout-coverage")
    # The legacy release above was counted but not validated: the gate stays shut until it leaves the window.
    assert "GATE_NOT_MET" in advance_in_ui(page, live_server, "payments", "V1_WRITES")
    db_clock.travel(3601)
    for _ in range(2):
        t = operator.create(namespace="payments").json()["task_id"]
        claim = new.claim(t).json()
        new.renew(claim)
        key = new.prepare(claim, "notify", {"t": t}).json()["effect_id"]
        new.outcome(claim, key, "COMMITTED")
        new.release(claim)
        claim = new.claim(t).json()
        new.finish(claim, {"t": t})
    assert "Advanced to V1_WRITES" in advance_in_ui(page, live_server, "payments", "V1_WRITES")

    # V1_WRITES → V1_ONLY: two clean drain snapshots DRAIN_INTERVAL apart.
    assert "GATE_NOT_MET" in advance_in_ui(page, live_server, "payments", "V1_ONLY")
    db_clock.travel(2)
    assert "Advanced to V1_ONLY" in advance_in_ui(page, live_server, "payments", "V1_ONLY")
    page.goto(f"{live_server.url}/ns/payments/")
    assert page.locator('ol.stepper li[aria-current="step"]').inner_text().startswith("V1_ONLY")
    shot(page, "06-rollout-v1-only")
    assert stage_of("payments") == "V1_ONLY"
    assert AuditEntry.objects.filter(action="namespace_set_stage", principal="ui:olivia").count() == 4


def test_an_oncall_fences_by_keyboard_and_sees_the_new_epoch(page, live_server, world, shot):
    world["operator"].create(node_id="probe")
    log_in(page, live_server, "oscar")
    page.goto(f"{live_server.url}/ns/default/")
    assert page.locator("#epoch").inner_text() == "1"

    page.locator("#fence-reason").focus()
    page.keyboard.type("incident 42: stale workers")
    page.keyboard.press("Tab")
    page.keyboard.type("default")
    shot(page, "07-fence-form")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")

    page.wait_for_selector("#fences")
    assert page.locator("#epoch").inner_text() == "2"
    assert page.locator("#paused").inner_text() == "PAUSED"
    assert "old-epoch commit refused: FENCED (EPOCH)" in page.locator("#fences").inner_text()
    shot(page, "08-fenced")
    assert AuditEntry.objects.filter(
        action="epoch_fence", principal="ui:oscar", reason="incident 42: stale workers"
    ).exists()


def test_enter_in_a_console_field_never_presses_a_destructive_button(page, live_server, world):
    worker = make_actor("enter-worker", "worker")
    claim = worker.claim(world["operator"].create(node_id="mail").json()["task_id"]).json()
    key = worker.prepare(claim, "mail", {"to": "ops"}).json()["effect_id"]
    worker.outcome(claim, key, "UNKNOWN")
    log_in(page, live_server, "oscar")

    page.goto(f"{live_server.url}/ns/default/")
    page.locator("#fence-reason").fill("typed, then Enter by habit")
    page.locator("#fence-confirm").fill("default")
    page.locator("#fence-confirm").press("Enter")
    page.goto(f"{live_server.url}/effects/")
    page.get_by_label("External reference").first.fill("ticket-9")
    page.get_by_label("External reference").first.press("Enter")
    page.wait_for_timeout(500)  # a submission, had one started, would have navigated by now

    assert Namespace.objects.get(name="default").scheduler_epoch == 1
    assert not AuditEntry.objects.filter(action__in=["fence_requested", "epoch_fence"]).exists()
    assert Effect.objects.get(pk=key).state == "UNKNOWN"


def test_a_reviewer_explains_a_mismatch_from_its_side_by_side_timelines(
    page, live_server, world, shot, db_clock
):
    operator, old, new = world["operator"], world["legacy"], world["v1"]
    operator.post("/namespaces", {"name": "ledger", "stage": "SHADOW"})
    task_id = operator.create(namespace="ledger", node_id="settle").json()["task_id"]
    legacy = lambda actor, op, **b: actor.client.post(  # noqa: E731
        f"/api/legacy/tasks/{task_id}/{op}", {"owner_id": actor.name, **b}, format="json"
    )
    legacy(old, "claim", ttl_seconds=5)
    db_clock.travel(6)
    claim = new.claim(task_id).json()
    new.finish(claim, {"by": "v1"})
    legacy(old, "complete", result={"by": "old"}, result_digest=digest({"by": "old"}))
    mismatch = Mismatch.objects.get()

    log_in(page, live_server, "olivia")
    page.goto(f"{live_server.url}/ns/ledger/mismatches")
    shot(page, "09-mismatch-report")
    page.get_by_role("link", name=str(mismatch.pk), exact=True).click()
    assert "STALE_COMMIT_ACCEPTED" in page.locator("h1").inner_text()
    offending = page.locator("#merged tr.offending").inner_text()
    assert "complete via the legacy API by legacy-w" in offending and "COMPLETED" in offending
    page.get_by_label("Note (required to explain)").fill(
        "legacy last-write-wins; claim.v1 kept the v1 winner"
    )
    shot(page, "10-mismatch-drilldown")
    page.get_by_role("button", name="Mark explained").click()

    assert page.locator("#status").inner_text() == "EXPLAINED"
    mismatch.refresh_from_db()
    assert (mismatch.status, mismatch.reviewed_by) == ("EXPLAINED", "ui:olivia")


def test_an_operator_approves_a_non_replayable_effect(page, live_server, world, shot):
    operator, new = world["operator"], world["v1"]
    task_id = operator.create(node_id="migrate-db", replay_policy="NON_REPLAYABLE").json()["task_id"]
    claim = new.claim(task_id).json()
    key = new.prepare(claim, "migrate", {"to": "v2"}).json()["effect_id"]

    log_in(page, live_server, "olivia")
    page.goto(f"{live_server.url}/effects/")
    page.get_by_label("Note").fill("change #88 reviewed")
    shot(page, "11-effects-backlog")
    page.get_by_role("button", name="Approve").click()

    assert "Approved: effect" in page.locator(".messages").inner_text()
    effect = Effect.objects.get(pk=key)
    assert effect.approved_by == "ui:olivia" and effect.approved_at is not None
    page.goto(f"{live_server.url}/tasks/{task_id}")
    shot(page, "12-task-page")
    assert "non-replayable, approved" in page.locator("main").inner_text()
