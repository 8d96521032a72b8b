"""The gateway in the console: operators configure downstream servers and tool rules (audited with the principal;
viewers may only look; bad input changes nothing), and tool calls show on the gateway page and the core's effect
lists with their tool, arguments' digest and answer."""

from __future__ import annotations

import json
from dataclasses import replace

from claims.models import AuditEntry
from gateway.models import Downstream, ToolCall, ToolRule
from tests.gateway.support import unknown_tool_call
from tests.support.console import login


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

    assert [a.status_code for a in answers] == [400] * 5  # the form again, each error beside its field
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
    assert b"counting/create_record" in gateway_page.content and b"no answer (UNKNOWN" in gateway_page.content
    unknown = effects_page.context["unknown"]
    assert (
        unknown[0].label["tool"] == "counting/create_record"
        and unknown[0].label["arguments_digest"] == digest
    )
    assert b"tool call" in effects_page.content and b"tool call" in task_page.content
    assert (ToolCall.objects.get().answered_at, AuditEntry.objects.count()) == before
    assert json.loads(json.dumps(gateway_page.context["calls"][0]["state"])) == "UNKNOWN"


def test_a_call_whose_gateway_died_mid_send_shows_sent_and_did_not_occur_needs_a_reason_and_a_tick(
    db, settings
):
    """Issue 35: the process died after the send began (its intent SENDING, no answer): the pages said "not sent"
    beside "It did not occur", which re-armed the effect with one click and an empty audit reason."""
    from claims.models import DispatchIntent, Effect, Principal
    from gateway.services import call_begin, call_lost, call_plan
    from tests.support.actors import make_actor

    settings.MCP_DOWNSTREAMS = [{"name": "counting", "prefix": "rec", "command": ["true"]}]
    settings.MCP_LOST_GRACE_SECONDS = 0
    operator, agent = make_actor("olivia-operator", "operator"), make_actor("agent-a", "worker")
    claim = agent.claim(operator.create(node_id="n").json()["task_id"]).json()
    plan = call_plan(
        principal=Principal.objects.get(name="agent-a"),
        attempt_id=claim["attempt_id"],
        exposed="rec__create_record",
        arguments={"name": "mid-send"},
        meta=None,
    )
    step = call_begin(plan)  # the send began; the process dies before any answer is recorded
    ui = login("operator")
    in_flight = ui.get("/gateway/")
    assert b"sent once, no answer yet" in in_flight.content and b"not sent" not in in_flight.content

    # the sweep records it lost (UNKNOWN) once its sender is silent past the timeout and the grace
    assert call_lost(step=step, downstream=replace(plan.downstream, call_timeout_seconds=0.001))
    effect_id = Effect.objects.get().effect_id
    page = ui.get("/effects/")
    assert page.context["unknown"][0].sent is True and b"<strong>Sent</strong>" in page.content

    refused = [
        ui.post(
            f"/effects/{effect_id}/reconcile", {"observed": "NOT_OCCURRED", "reason": "checked"}
        ),  # no tick
        ui.post(
            f"/effects/{effect_id}/reconcile", {"observed": "NOT_OCCURRED", "reason": "  ", "confirm": "on"}
        ),
    ]
    assert Effect.objects.get().state == "UNKNOWN" and not AuditEntry.objects.filter(
        action="effect_reconcile"
    )
    assert all(r.status_code == 400 for r in refused)
    done = ui.post(
        f"/effects/{effect_id}/reconcile",
        {"observed": "NOT_OCCURRED", "reason": "the ticket system has no such ticket", "confirm": "on"},
    )
    assert done.status_code == 302 and Effect.objects.get().state == "PREPARED"
    (entry,) = AuditEntry.objects.filter(action="effect_reconcile")
    assert (entry.principal, entry.reason) == ("ui:operator-user", "the ticket system has no such ticket")
    assert DispatchIntent.objects.get().not_sent is False
