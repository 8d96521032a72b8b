"""axe-core (tests/e2e/package.json, from npm) on every console page and the error pages, at a phone's width and a
desktop's, in Chromium (issue 14 item 9): no violation. Also the focus outline's contrast against the page (≥ 3:1,
WCAG 2.2 focus appearance) and nothing wider than a 390 px screen."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from claims.models import Principal
from rollout.models import Mismatch
from tests.e2e.test_console import log_in, ui_user
from tests.support.actors import ensure_default_namespace, make_actor

pytestmark = [pytest.mark.django_db(transaction=True)]
HERE = Path(__file__).resolve().parent
AXE = HERE / "node_modules/axe-core/axe.min.js"


@pytest.fixture(scope="module")
def axe() -> Path:
    if not AXE.exists():
        if not shutil.which("npm"):
            pytest.skip("needs node and npm for axe-core: run scripts/install-node.sh")
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--silent"], cwd=HERE, check=True, timeout=300
        )
    return AXE


def _violations(page, axe: Path) -> list[str]:
    page.add_script_tag(path=str(axe))
    found = page.evaluate("async () => (await axe.run(document)).violations")
    return [f"{v['id']}: {v['help']} ({len(v['nodes'])}× e.g. {v['nodes'][0]['html'][:120]})" for v in found]


WIDEST = """() => [...document.querySelectorAll('body *')]
  .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1)
  .map(e => `${e.tagName}.${e.className} ${Math.round(e.getBoundingClientRect().right)}`).slice(0, 5)"""


def _contrast(page) -> float:
    """The focused element's outline colour against the page's background, WCAG's contrast ratio."""
    return page.evaluate(
        """() => {
        const lum = (c) => { const [r, g, b] = c.match(/\\d+/g).slice(0, 3).map(Number).map(v => {
            v /= 255; return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4); });
            return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
        const outline = getComputedStyle(document.activeElement).outlineColor;
        const background = getComputedStyle(document.body).backgroundColor;
        const bg = background === 'rgba(0, 0, 0, 0)' ? 'rgb(255, 255, 255)' : background;
        const [a, b] = [lum(outline), lum(bg)].sort((x, y) => y - x);
        return (a + 0.05) / (b + 0.05); }"""
    )


@pytest.mark.parametrize("width", [390, 1280])
def test_every_console_page_passes_axe_and_fits_the_screen(page, live_server, axe, width):
    ensure_default_namespace()
    ui_user("oscar", "oncall")
    operator, worker = make_actor("api-operator", "operator"), make_actor("w-a11y", "worker", "v1")
    worker.post("/workers/register", {"protocol": "claim.v1", "binary_version": "1", "namespace": "default"})
    task_id = operator.create().json()["task_id"]
    claim = worker.claim(task_id).json()
    worker.prepare(claim, "notify", {"n": 1})
    Mismatch.objects.create(
        namespace="default", task_id=task_id, operation="complete", api="legacy", legacy={}, v1={},
        reason="STALE_COMMIT_ACCEPTED", at=Principal.objects.first().created_at,
    )  # fmt: skip
    mismatch = Mismatch.objects.get()
    page.set_viewport_size({"width": width, "height": 900})
    log_in(page, live_server, "oscar")

    problems = {}
    for path in [
        "/", "/ns/default/", "/ns/default/fence", "/ns/default/mismatches", f"/mismatches/{mismatch.pk}",
        "/tasks/", f"/tasks/{task_id}", "/effects/", "/audit/", "/pools/", "/glance/", "/jobs/", "/no/such/page/",
    ]:  # fmt: skip
        page.goto(f"{live_server.url}{path}")
        found = _violations(page, axe)
        if not page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"):
            wide = page.evaluate(WIDEST)
            found.append(f"wider than the {width} px screen: {wide}")
        if found:
            problems[path] = found
    page.goto(f"{live_server.url}/audit/")
    page.keyboard.press("Tab")

    assert problems == {}, json.dumps(problems, indent=1)
    assert _contrast(page) >= 3.0


def test_the_forbidden_page_passes_axe(page, live_server, axe):
    ensure_default_namespace()
    ui_user("vic", "viewer")
    log_in(page, live_server, "vic")

    refused = page.goto(f"{live_server.url}/audit/")

    assert refused.status == 403
    assert _violations(page, axe) == []
