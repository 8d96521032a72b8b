"""Error pages (issue 14 item 9): the console answers a styled HTML page for 403, 404 and 500; the API, the metrics
and the probes keep the contract's JSON."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import path

from controlplane import handlers
from controlplane.urls import urlpatterns as site_urls
from tests.console.test_pages import login


def _explode(request):
    raise RuntimeError("boom")


urlpatterns = [path("console-boom/", _explode), path("api/v1/boom/", _explode), *site_urls]
handler404, handler500 = handlers.not_found, handlers.server_error


def test_an_unknown_console_address_is_a_styled_html_404_and_an_unknown_api_one_json(db):
    page = Client().get("/no/such/page/")
    api = Client().get("/api/v1/no/such/endpoint")

    assert page.status_code == 404 and page["Content-Type"].startswith("text/html")
    assert b"404 \xc2\xb7 Not found" in page.content and b"console.css" in page.content
    assert api.status_code == 404 and api.json()["outcome"] == "NOT_FOUND"


def test_a_role_refusal_is_a_styled_html_403_naming_the_role_needed(db):
    refused = login("viewer").get("/audit/")

    assert refused.status_code == 403 and refused["Content-Type"].startswith("text/html")
    assert b"403 \xc2\xb7 Not allowed" in refused.content and b"it needs operator" in refused.content


@pytest.mark.urls("tests.console.test_error_pages")
def test_a_crash_is_a_styled_html_500_in_the_console_and_json_in_the_api(db):
    client = Client(raise_request_exception=False)

    page = client.get("/console-boom/")
    api = client.get("/api/v1/boom/")

    assert page.status_code == 500 and b"500 \xc2\xb7 Something went wrong" in page.content
    assert b"boom" not in page.content  # nothing of the error leaks to the page
    assert api.status_code == 500 and api.json() == {"outcome": "ERROR", "detail": "internal error"}
