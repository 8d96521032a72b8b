"""The Tool gateway page in Chromium: an operator adds a downstream server and a tool rule through the forms (each
audited), a tool call shows in the live table within one refresh, with its tool, arguments' digest and answer, and
the effects backlog labels an UNKNOWN tool call for reconciling."""

from __future__ import annotations

import pytest
from playwright.sync_api import expect

from claims.models import AuditEntry
from gateway.models import Downstream, ToolRule
from tests.e2e.test_console import log_in, ui_user
from tests.gateway.support import unknown_tool_call
from tests.support.actors import ensure_default_namespace

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_an_operator_configures_the_gateway_and_sees_tool_calls_arrive(page, live_server, settings, shot):
    ensure_default_namespace()
    ui_user("olga", "operator")
    log_in(page, live_server, "olga")
    page.goto(f"{live_server.url}/gateway/")
    page.evaluate("window.__notReloaded = true")

    page.locator("#add-downstream summary").click()
    page.locator("#ds-name").fill("counting")
    page.locator("#ds-prefix").fill("rec")
    page.locator("#ds-transport").select_option("stdio")
    page.locator("#ds-command").fill("python3\ntests/gateway/counting_server.py\n--ledger\n/tmp/ledger.jsonl")
    page.get_by_role("button", name="Save server").click()
    expect(page.locator("#downstreams")).to_contain_text("counting")
    page.locator("#set-rule summary").click()
    page.locator("#rule-downstream").fill("counting")
    page.locator("#rule-tool").fill("create_record")
    page.locator("#rule-query").fill("find_record")
    page.locator("#rule-query-args").fill('{"name": "$name"}')
    page.get_by_role("button", name="Save rule").click()
    expect(page.locator("#tool-rules")).to_contain_text("find_record")
    assert Downstream.objects.get().command[1] == "tests/gateway/counting_server.py"
    assert ToolRule.objects.get().query_arguments == {"name": "$name"}
    assert set(AuditEntry.objects.values_list("action", flat=True)) == {
        "mcp_downstream_save",
        "mcp_tool_rule_set",
    }

    page.evaluate("window.__notReloaded = true")
    unknown_tool_call("invoice-7")

    row = page.locator("#tool-calls tbody tr").first
    expect(row).to_contain_text("counting/create_record", timeout=10_000)  # the live table, no reload
    expect(row).to_contain_text("UNKNOWN")
    expect(row).to_contain_text("no answer (UNKNOWN")
    assert page.evaluate("window.__notReloaded") is True
    shot(page, "20-tool-gateway")

    page.goto(f"{live_server.url}/effects/")
    expect(page.locator(".effect-label").first).to_contain_text("counting/create_record")
