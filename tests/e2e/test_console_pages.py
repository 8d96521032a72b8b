"""The console's audit page, Pools numbers and error pages in a real browser (issue 14 items 6, 8, 9): filter the
audit log to one action and one principal; read a pool's live leases; an unknown address and a refused role answer
styled pages that fit a 390 px screen."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from claims.models import AuditEntry
from tests.e2e.test_console import log_in, ui_user
from tests.support.actors import ensure_default_namespace, make_actor

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_the_audit_page_filters_by_action_and_principal(page, live_server, shot):
    ensure_default_namespace()
    ui_user("oscar", "oncall")
    api_oncall, other = make_actor("ona-oncall", "oncall"), make_actor("otto-oncall", "oncall")
    assert api_oncall.post("/namespaces/default/fence", {"reason": "stale writers (API)"}).status_code == 200
    assert api_oncall.post("/namespaces/default/resume", {"reason": "writers gone"}).status_code == 200
    call_command("fence", "default", reason="drill from the terminal", principal=other.name)

    log_in(page, live_server, "oscar")
    page.get_by_role("link", name="Audit").click()
    assert page.locator("#audit tbody tr").count() == AuditEntry.objects.count() >= 3
    page.get_by_label("Action").select_option("epoch_fence")
    page.get_by_label("Principal").fill("ona-oncall")
    page.get_by_role("button", name="Filter").click()

    rows = page.locator("#audit tbody tr")
    assert rows.count() == 1
    assert "stale writers (API)" in rows.first.inner_text() and "ona-oncall" in rows.first.inner_text()
    assert "principal=ona-oncall" in page.url and "action=epoch_fence" in page.url
    page.get_by_label("Principal").fill("")
    page.get_by_role("button", name="Filter").click()
    assert page.locator("#audit tbody tr").count() == 2  # both fences, API and CLI
    shot(page, "13-audit")


def test_the_pools_page_shows_live_leases_per_namespace_and_pool(page, live_server, shot):
    ensure_default_namespace()
    ui_user("vic", "viewer")
    operator, worker = make_actor("api-operator", "operator"), make_actor("pia-v1", "worker", "v1")
    worker.post(
        "/workers/register", {"protocol": "claim.v1", "binary_version": "2.4", "namespace": "default"}
    )
    for _ in range(2):
        worker.claim(operator.create().json()["task_id"])

    log_in(page, live_server, "vic")
    page.get_by_role("link", name="Pools").click()

    assert page.locator("#pool-leases tbody tr").first.inner_text().split() == [
        "default",
        "v1",
        "2",
        "0",
        "2",
    ]
    assert "pia-v1" in page.locator("#workers").inner_text()
    shot(page, "15-pools")


@pytest.mark.parametrize("width", [390, 1280])
def test_error_pages_are_styled_and_fit_the_screen(page, live_server, shot, width):
    ensure_default_namespace()
    ui_user("vic", "viewer")
    page.set_viewport_size({"width": width, "height": 800})
    log_in(page, live_server, "vic")

    missing = page.goto(f"{live_server.url}/no/such/page/")
    assert missing.status == 404 and page.get_by_role("heading", name="404 · Not found").is_visible()
    fits = page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    refused = page.goto(f"{live_server.url}/audit/")

    assert refused.status == 403 and "it needs operator" in page.locator("main").inner_text()
    assert fits and page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    if width == 390:
        shot(page, "14-forbidden-390px")


def test_a_tasks_lanes_show_the_fenced_attempt_fenced_and_the_holder_holding(page, live_server, shot):
    ensure_default_namespace()
    ui_user("vic", "viewer")
    operator, oncall = make_actor("api-operator", "operator"), make_actor("ona-oncall", "oncall")
    first, second = make_actor("w-first", "worker"), make_actor("w-second", "worker")
    task_id = operator.create().json()["task_id"]
    claim = first.claim(task_id).json()
    first.renew(claim)
    oncall.post("/namespaces/default/fence", {"reason": "drill"})
    first.renew(claim)  # refused, FENCED EPOCH
    oncall.post("/namespaces/default/resume", {"reason": "over"})
    second.claim(task_id, epoch=2)

    log_in(page, live_server, "vic")
    page.goto(f"{live_server.url}/tasks/{task_id}")

    assert page.locator(".lane-bar.fenced").count() == 1 and page.locator(".lane-bar.holding").count() == 1
    rows = page.locator("#lanes-text tbody tr")
    assert "fenced" in rows.nth(0).inner_text() and "refused FENCED EPOCH" in rows.nth(0).inner_text()
    assert "holding" in rows.nth(1).inner_text()
    shot(page, "19-task-lanes")


def test_a_mismatch_shows_both_winners_a_diff_and_the_merged_timeline(page, live_server, db_clock, shot):
    from claims.digest import digest
    from rollout.models import Mismatch

    ui_user("rita", "operator")
    operator = make_actor("api-operator", "operator")
    a, b = make_actor("w-late", "worker", "legacy"), make_actor("w-next", "worker", "legacy")
    operator.post("/namespaces", {"name": "shade", "stage": "SHADOW"})
    task_id = operator.create(namespace="shade").json()["task_id"]

    def legacy(actor, op, **body):
        actor.client.post(
            f"/api/legacy/tasks/{task_id}/{op}", {"owner_id": actor.name, **body}, format="json"
        )

    legacy(a, "claim", ttl_seconds=5)
    db_clock.travel(6)
    legacy(b, "claim", ttl_seconds=30)
    legacy(b, "complete", result={"by": "next"}, result_digest=digest({"by": "next"}))
    legacy(a, "complete", result={"by": "late"}, result_digest=digest({"by": "late"}))
    mismatch = Mismatch.objects.get(reason="STALE_COMMIT_ACCEPTED")

    log_in(page, live_server, "rita")
    page.goto(f"{live_server.url}/mismatches/{mismatch.pk}")

    assert (
        "w-late" in page.locator("#winners").inner_text()
        and "w-next" in page.locator("#winners").inner_text()
    )
    assert '"by": "late"' in page.locator("#diff").inner_text()
    stores = page.locator("#merged tbody tr td:nth-child(3)").all_inner_texts()
    assert {"legacy", "claim.v1"} <= set(stores)
    assert (
        page.locator("#merged tr.offending").count() == 1
        and "w-late" in page.locator("#merged tr.offending").inner_text()
    )
    shot(page, "20-mismatch-drilldown")


def test_the_gate_checklist_links_to_what_holds_it_shut(page, live_server, shot):
    from claims import clock
    from rollout.models import Mismatch
    from rollout.tasks import gate_check

    ui_user("rita", "operator")
    operator = make_actor("api-operator", "operator")
    operator.post("/namespaces", {"name": "shady", "stage": "SHADOW"})
    for _ in range(2):
        Mismatch.objects.create(
            namespace="shady", task_id=operator.create(namespace="shady").json()["task_id"], operation="complete",
            api="legacy", legacy={}, v1={}, reason="STALE_COMMIT_ACCEPTED", at=clock.now(),
        )  # fmt: skip
    gate_check("shady")

    log_in(page, live_server, "rita")
    page.goto(f"{live_server.url}/ns/shady/")
    row = page.locator("#checklist tr", has_text="open mismatches")
    assert "✗ not met" in row.inner_text() and "none" in row.inner_text()
    assert page.locator("#advance-when").is_visible() and page.locator("#advance-link").count() == 0
    shot(page, "22-gate-checklist")
    row.get_by_role("link", name="2").click()

    page.wait_for_url(f"{live_server.url}/ns/shady/mismatches?status=OPEN")
    assert page.locator("#mismatch-list tbody tr").count() == 2


def test_the_mismatch_list_at_390_px_shows_each_reason_and_status_on_screen(page, live_server, shot):
    """Issue 36: at 390 px the mismatch list hid Reason and Status off-screen (the table scrolled sideways). Each
    row now stacks as a card, its cells named, Reason and Status first; nothing is wider than the screen."""
    from claims import clock
    from rollout.models import Mismatch

    ui_user("rita", "reviewer")
    operator = make_actor("api-operator", "operator")
    operator.post("/namespaces", {"name": "shady", "stage": "SHADOW"})
    for reason in ("STALE_COMMIT_ACCEPTED", "WINNER_DIFFERS"):
        Mismatch.objects.create(
            namespace="shady", task_id=operator.create(namespace="shady").json()["task_id"], operation="complete",
            api="legacy", legacy={}, v1={}, reason=reason, at=clock.now(),
        )  # fmt: skip
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, live_server, "rita")

    page.goto(f"{live_server.url}/ns/shady/mismatches")

    cells = page.evaluate(
        """() => {
          const heads = [...document.querySelectorAll('#mismatch-list thead th')].map((th) => th.textContent.trim());
          return [...document.querySelectorAll('#mismatch-list tbody tr')].flatMap((tr) =>
            ['Reason', 'Status'].map((name) => {
              const box = tr.children[heads.indexOf(name)].getBoundingClientRect();
              return [name, box.left, box.right];
            }));
        }"""
    )
    assert len(cells) == 4 and all(left >= 0 and right <= 390 for _, left, right in cells), cells
    first = page.locator("#mismatch-list tbody tr").first.locator("td.mm-reason")
    assert first.inner_text() == "WINNER_DIFFERS"
    assert first.evaluate("td => getComputedStyle(td, '::before').content") == '"Reason: "'  # each cell named
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")
    shot(page, "23-mismatches-390px")
