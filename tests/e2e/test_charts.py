"""Charts (issue 14 item 7), drawn by Chart.js in Chromium: claims, commits and fenced commits per minute per
namespace; mismatches per hour by reason; drain progress across snapshots; coverage per acceptance point — each with
axis titles and its numbers as a table beside it (the text alternative), the same numbers the chart draws."""

from __future__ import annotations

import pytest

from tests.e2e.test_console import log_in, ui_user
from tests.support.actors import ensure_default_namespace, make_actor

pytestmark = [pytest.mark.django_db(transaction=True)]

DRAWN = """(id) => { const chart = Chart.getChart(document.getElementById(id));
  return chart && { y: chart.options.scales.y.title.text, x: chart.options.scales.x.title.text,
    totals: Object.fromEntries(chart.data.datasets.map(d => [d.label, d.data.reduce((a, b) => a + b, 0)])) }; }"""


def test_the_console_draws_its_charts_with_axes_and_a_table_of_the_same_numbers(page, live_server, shot):
    ensure_default_namespace()
    ui_user("vic", "viewer")
    operator, oncall = make_actor("api-operator", "operator"), make_actor("ona-oncall", "oncall")
    a, b = make_actor("w-a", "worker"), make_actor("w-b", "worker")
    for _ in range(3):
        a.finish(a.claim(operator.create().json()["task_id"]).json(), "done")
    late = b.claim(operator.create().json()["task_id"]).json()
    oncall.post("/namespaces/default/fence", {"reason": "drill"})
    b.commit_inline(late, "too late")  # refused: FENCED
    for _ in range(2):
        operator.post("/namespaces/default/drain")

    log_in(page, live_server, "vic")
    page.goto(f"{live_server.url}/glance/")
    activity = page.evaluate(DRAWN, "activity-default-canvas")
    page.goto(f"{live_server.url}/ns/default/")
    page.wait_for_function("Chart.getChart(document.getElementById('drain-canvas'))")
    drain = page.evaluate(DRAWN, "drain-canvas")
    coverage = page.evaluate(DRAWN, "coverage-canvas")
    shot(page, "21-namespace-charts")

    assert activity == {
        "y": "per minute",
        "x": "minutes ago",
        "totals": {"claims": 4, "commits": 3, "fenced commits": 1},
    }
    assert drain["y"] == "count" and drain["totals"]["live leases"] == 0
    assert coverage["totals"]["validated"] >= 8 and coverage["x"] == "acceptance point"
    page.locator("details:has(#coverage-table) summary").click()
    table = page.locator("#coverage-table").inner_text()
    assert "claim" in table and "commit" in table


def test_the_status_chart_draws_a_bug_red_and_an_explained_mismatch_green(page, live_server):
    """Issue 24: the colours were the palette's by position — EXPLAINED red, BUG green."""
    from claims import clock
    from rollout.models import Mismatch

    ensure_default_namespace()
    ui_user("vic", "viewer")
    for status in ("OPEN", "EXPLAINED", "BUG"):
        Mismatch.objects.create(
            namespace="default", task_id="t", operation="complete", api="legacy", legacy={}, v1={},
            reason="STALE_COMMIT_ACCEPTED", status=status, note="reviewed" if status != "OPEN" else "",
            reviewed_by="olivia" if status != "OPEN" else "", at=clock.now(),
        )  # fmt: skip
    log_in(page, live_server, "vic")
    page.goto(f"{live_server.url}/ns/default/mismatches")
    page.wait_for_function("Chart.getChart(document.getElementById('mm-status-canvas'))")

    colours = page.evaluate(
        "Object.fromEntries(Chart.getChart(document.getElementById('mm-status-canvas')).data.datasets"
        ".map(d => [d.label, d.backgroundColor]))"
    )

    assert colours == {"OPEN": "#8a5a00", "EXPLAINED": "#1d6b38", "BUG": "#8a1c1c"}
