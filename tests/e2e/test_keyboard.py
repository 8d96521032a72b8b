"""The keyboard in the console (issue 36, point 5), in Chromium: a skip link first in the tab order that lands on
the page's content, the focus on the field to fix after a refused form, and a favicon."""

from __future__ import annotations

import pytest

from claims.models import Namespace
from tests.e2e.test_console import log_in, ui_user
from tests.support.actors import ensure_default_namespace

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_the_skip_link_the_focus_after_a_typo_and_the_favicon(page, live_server):
    ensure_default_namespace()
    ui_user("oscar", "oncall")
    log_in(page, live_server, "oscar")

    page.goto(f"{live_server.url}/ns/default/fence")
    page.keyboard.press("Tab")
    assert page.evaluate("document.activeElement.textContent") == "Skip to the page's content"
    page.keyboard.press("Enter")
    assert page.evaluate("document.activeElement.id") == "main"

    page.locator("#fence-reason").fill("incident 7")
    page.locator("#fence-confirm").fill("defualt")  # a typo
    page.get_by_role("button", name="Fence the epoch").click()
    page.wait_for_load_state()
    assert page.evaluate("document.activeElement.id") == "fence-confirm"  # before: the page's body
    assert Namespace.objects.get(name="default").scheduler_epoch == 1

    icon = page.request.get(f"{live_server.url}/favicon.ico")
    assert icon.status == 200 and "svg" in icon.headers["content-type"]
