"""The namespace page updates itself (issue 14 item 1), in Chromium: a fence requested elsewhere shows as pending,
then as the new epoch with its self-check when its job runs — with no reload (a marker set in the page survives)
and without losing what the on-call engineer is typing in the fence form."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from claims.models import Principal
from oncall import services as fences
from tests.e2e.test_console import log_in, ui_user
from tests.support.actors import ensure_default_namespace, make_actor

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_a_fence_made_elsewhere_shows_on_the_open_page_without_a_reload(page, live_server, shot):
    """Issue 24: a fence acts in its request, so the open page shows the new epoch, PAUSED and Resume within one
    refresh — no reload — and the self-check's verdict when its job has run."""
    ensure_default_namespace()
    ui_user("oscar", "oncall")
    elsewhere = make_actor("ona-oncall", "oncall")
    log_in(page, live_server, "oscar")
    page.goto(f"{live_server.url}/ns/default/")
    page.evaluate("window.__notReloaded = true")
    page.locator("#fence-reason").fill("typing, not submitted")
    expect(page.locator("#epoch")).to_have_text("1")
    expect(page.locator("#resume-form")).to_have_count(0)

    request = fences.fence(
        principal=Principal.objects.get(name=elsewhere.name),
        namespace="default",
        reason="fenced elsewhere",
    )
    expect(page.locator("#epoch")).to_have_text("2", timeout=10_000)
    expect(page.locator("#paused")).to_have_text("PAUSED")
    expect(page.locator("#resume-form")).to_be_visible()  # Resume, offered without a reload
    expect(page.locator("#fences")).to_contain_text("waiting for its job")
    page.locator("#resume-reason").fill("typing a resume reason")
    fences.fence_check(fence_id=request.pk)  # the job runs

    expect(page.locator("#fences tbody tr").first).to_contain_text("✓", timeout=10_000)
    assert page.evaluate("window.__notReloaded") is True
    assert page.locator("#fence-reason").input_value() == "typing, not submitted"
    assert page.locator("#resume-reason").input_value() == "typing a resume reason"  # kept across refreshes
    shot(page, "16-live-fence")


def test_the_drain_chart_is_drawn_again_after_every_refresh(page, live_server):
    """Issue 24: the drain chart went blank after the first 3 s refresh (the redraw ran on the replaced element,
    not the one in the page). After two refreshes the canvas in the page is a new one, and its chart is drawn on
    it."""
    from rollout.services.stages import drain_snapshot

    ensure_default_namespace()
    ui_user("vic", "viewer")
    for _ in range(2):
        drain_snapshot(namespace="default")
    log_in(page, live_server, "vic")
    page.goto(f"{live_server.url}/ns/default/")
    page.wait_for_function("Chart.getChart(document.getElementById('drain-canvas'))")
    page.evaluate("document.getElementById('drain-canvas').dataset.first = 'yes'")
    first_taken = page.locator("#taken-at").inner_text()

    page.wait_for_function(
        f"document.getElementById('taken-at').innerText !== {first_taken!r}", timeout=10_000
    )
    page.wait_for_timeout(3_500)  # and one more refresh

    drawn = page.evaluate(
        "(() => { const c = document.getElementById('drain-canvas'); const chart = Chart.getChart(c);"
        " return {fresh: c.dataset.first !== 'yes', points: chart ? chart.data.labels.length : null,"
        " size: chart ? [chart.width, chart.height] : null, box: [c.clientWidth, c.clientHeight]}; })()"
    )
    assert drawn["fresh"] and drawn["points"] == 2
    # Drawn on the canvas in the page: Chart.js sized it to its box (a blank canvas keeps its default 300 × 150).
    width, height = drawn["size"]
    assert drawn["box"] == [round(width), round(height)] and drawn["box"] != [300, 150]


def test_fence_from_the_overview_in_one_step_with_a_typo_caught_beside_its_field(page, live_server, shot):
    ensure_default_namespace()
    ui_user("oscar", "oncall")
    log_in(page, live_server, "oscar")

    page.get_by_role("link", name="Fence default…").click()
    page.get_by_label("Reason (required)").fill("runaway worker writes late")
    page.get_by_label("Type default to confirm").fill("defualt")
    page.get_by_role("button", name="Fence the epoch").click()

    expect(page.locator("#fence-confirm-error")).to_contain_text(
        "Type the namespace's name, default, exactly."
    )
    assert page.get_by_label("Reason (required)").input_value() == "runaway worker writes late"
    shot(page, "17-fence-typo")
    page.get_by_label("Type default to confirm").fill("default")
    page.get_by_role("button", name="Fence the epoch").click()

    page.wait_for_url(f"{live_server.url}/ns/default/")
    expect(page.locator("#epoch")).to_have_text("2")
    expect(page.locator("#incident")).to_contain_text("runaway worker writes late")
    shot(page, "18-incident-header")


def test_the_effects_backlog_and_a_tasks_page_update_without_a_reload(page, live_server):
    from claims.models import Effect

    ensure_default_namespace()
    ui_user("olivia", "operator")
    operator, worker = make_actor("api-operator", "operator"), make_actor("w-live", "worker")
    first = operator.create().json()["task_id"]
    claim = worker.claim(first).json()
    key = worker.prepare(claim, "notify", {"n": 1}).json()["effect_id"]
    worker.outcome(claim, key, "UNKNOWN")
    log_in(page, live_server, "olivia")

    page.goto(f"{live_server.url}/effects/")
    page.evaluate("window.__notReloaded = true")
    page.get_by_label("External reference").fill("ticket-42")
    second = operator.create().json()["task_id"]
    other = worker.claim(second).json()
    other_key = worker.prepare(other, "notify", {"n": 2}).json()["effect_id"]
    worker.outcome(other, other_key, "UNKNOWN")
    expect(page.get_by_label("External reference")).to_have_count(2, timeout=10_000)
    assert page.evaluate("window.__notReloaded") is True
    assert page.get_by_label("External reference").first.input_value() == "ticket-42"
    assert Effect.objects.filter(state="UNKNOWN").count() == 2

    page.goto(f"{live_server.url}/tasks/{second}")
    page.evaluate("window.__notReloaded = true")
    worker.release(other)
    worker.claim(second)
    expect(page.locator("#lanes-text tbody tr")).to_have_count(2, timeout=10_000)
    assert page.evaluate("window.__notReloaded") is True


def test_the_incident_header_is_live_on_the_fence_form_and_the_mismatch_report_and_says_when_it_is_stale(
    page, live_server
):
    """Issue 36: fenced through the API, the fence form and the mismatch report still said "open", epoch 2, 8 s
    later. Now each shows the new epoch within a refresh, keeps what is typed, and — when refreshes stop
    arriving — marks the header stale with its age."""
    ensure_default_namespace()
    ui_user("oscar", "oncall")
    elsewhere = make_actor("ona-oncall", "oncall")
    log_in(page, live_server, "oscar")
    report = page.context.new_page()
    report.goto(f"{live_server.url}/ns/default/mismatches")
    page.goto(f"{live_server.url}/ns/default/fence")
    page.locator("#fence-reason").fill("typing, not submitted")
    expect(page.locator("#epoch")).to_have_text("1")

    elsewhere.post("/namespaces/default/fence", {"reason": "fenced through the API"})

    for shown in (page, report):
        expect(shown.locator("#epoch")).to_have_text("2", timeout=10_000)
        expect(shown.locator("#paused")).to_have_text("PAUSED")
    assert page.locator("#fence-reason").input_value() == "typing, not submitted"
    expect(page.locator("#incident-live .stale-mark")).to_be_hidden()

    page.route("**/incident?part=header", lambda route: route.abort())  # the server can no longer be reached
    expect(page.locator("#incident-live .stale-mark")).to_be_visible(timeout=15_000)
    assert int(page.locator("#incident-live .stale-for").inner_text()) >= 7
