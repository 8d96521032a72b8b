"""Headless Chromium (Debian's, installed by scripts/install-browser.sh) driven by Playwright against the live
server. Screenshots land outside the checkout (a folder in the system's temporary directory), so `make test` leaves
the clone as it found it; `make screenshots` (CONSOLE_SCREENSHOTS=docs) writes them to docs/screenshots/, which the
runbook (docs/operations.md) shows."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
DOCS_SHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
SHOTS = (
    DOCS_SHOTS
    if os.environ.get("CONSOLE_SCREENSHOTS") == "docs"
    else Path(tempfile.gettempdir()) / "claim-control-plane-screenshots"
)


@pytest.fixture(scope="session")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.skip("needs Debian's chromium: run scripts/install-browser.sh (.ci/run does)")
    os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")  # the ORM is used between Playwright calls
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-sync",
                "--disable-background-networking",
                "--disable-component-update",
            ],
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(15000)
    yield page
    context.close()


@pytest.fixture
def shot():
    SHOTS.mkdir(parents=True, exist_ok=True)

    def take(page, name: str) -> Path:
        path = SHOTS / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return take
