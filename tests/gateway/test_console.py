"""The gateway in the console: operators configure downstream servers and tool rules (audited with the principal;
viewers may only look; bad input changes nothing), and tool calls show on the gateway page and the core's effect
lists with their tool, arguments' digest and answer."""

from __future__ import annotations

import json

from claims.models import AuditEntry
from gateway.models import Downstream, ToolCall, ToolRule
from tests.console.test_pages import login
from tests.gateway.support import unknown_tool_call


def test_operators_add_a_server_and_a_rule_and_both_are_audited(db):
    operator_ui, viewer = login("operator"), login("viewer")

    saved = operator_ui.post(
        "/gateway/downstreams",
        {
            "name": "files",
            "prefix": "fs",
            "transport": "stdio",
            "command": "npx\n@modelcontextprotocol/server-filesystem\n/srv/data",
            "call_timeout_seconds": "20",
        },
    )
    rule = operator_ui.post(
        "/gateway/rules",
        {
            "downstream": "files",
            "tool": "write_file",
            "kind": "EFFECT",
            "slot_from": "ARGUMENT",
            "slot_argument": "path",
            "query_tool": "read_text_file",
            "query_arguments": '{"path": "$path"}',
            "occurred_if": "TEXT_CONTAINS",
            "occurred_text": "$content",
        },
    )
    refused = viewer.post("/gateway/downstreams", {"name": "x", "transport": "http", "url": "http://h/mcp"})

    assert saved.status_code == 302 and rule.status_code == 302 and refused.status_code == 403
    server = Downstream.objects.get()
    assert (server.prefix, server.command) == (
        "fs",
        ["npx", "@modelcontextprotocol/server-filesystem", "/srv/data"],
    )
    assert ToolRule.objects.get().query_arguments == {"path": "$path"}
    actions = list(AuditEntry.objects.order_by("id").values_list("action", "principal", "target"))
    assert actions == [
        ("mcp_downstream_save", "ui:operator-user", "files"),
        ("mcp_tool_rule_set", "ui:operator-user", "files/write_file"),
    ]
    page = viewer.get("/gateway/")
    assert (
        page.status_code == 200 and b"files/write_file" in page.content and b"Save server" not in page.content
    )


def test_bad_configuration_is_refused_with_the_field_and_changes_nothing(db):
    operator_ui = login("operator")

    answers = [
        operator_ui.post(
            "/gateway/downstreams", {"name": "a", "transport": "stdio", "command": ""}, follow=True
        ),
        operator_ui.post(
            "/gateway/downstreams",
            {"name": "b", "prefix": "x__y", "transport": "http", "url": "http://h"},
            follow=True,
        ),
        operator_ui.post(
            "/gateway/rules", {"downstream": "a", "tool": "t", "query_arguments": "[1"}, follow=True
        ),
        operator_ui.post(
            "/gateway/rules", {"downstream": "a", "tool": "t", "slot_from": "ARGUMENT"}, follow=True
        ),
        operator_ui.post(
            "/gateway/downstreams",
            {"name": "c", "transport": "http", "url": "http://h", "call_timeout_seconds": "soon"},
            follow=True,
        ),
    ]

    assert [a.status_code for a in answers] == [200] * 5
    texts = [" ".join(str(m) for m in a.context["messages"]) for a in answers]
    for text, field in zip(
        texts, ["command", "prefix", "query_arguments", "slot_argument", "call_timeout_seconds"], strict=True
    ):
        assert field in text, text
    assert (
        not Downstream.objects.exists() and not ToolRule.objects.exists() and not AuditEntry.objects.exists()
    )


def test_tool_calls_show_with_tool_digest_and_answer_and_reading_writes_nothing(db, settings):
    settings.MCP_DOWNSTREAMS = [{"name": "counting", "prefix": "rec", "command": ["true"]}]
    claim, plan = unknown_tool_call("x")
    viewer = login("viewer")
    before = (ToolCall.objects.get().answered_at, AuditEntry.objects.count())

    gateway_page = viewer.get("/gateway/")
    effects_page = viewer.get("/effects/")
    task_page = viewer.get(f"/tasks/{claim['task_id']}")

    digest = plan.payload_digest
    assert (
        b"counting/create_record" in gateway_page.content and b"no answer (UNKNOWN)" in gateway_page.content
    )
    unknown = effects_page.context["unknown"]
    assert (
        unknown[0].label["tool"] == "counting/create_record"
        and unknown[0].label["arguments_digest"] == digest
    )
    assert b"tool call" in effects_page.content and b"tool call" in task_page.content
    assert (ToolCall.objects.get().answered_at, AuditEntry.objects.count()) == before
    assert json.loads(json.dumps(gateway_page.context["calls"][0]["state"])) == "UNKNOWN"
