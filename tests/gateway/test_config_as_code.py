"""The gateway configured as code (issue 35, point 4): downstream servers and tool rules through the REST API and
``claimctl gateway``, with the same validation (field errors, nothing written on bad input) and the same audit as
the console, which shows the same records."""

from __future__ import annotations

import json

import pytest
from django.core.management import CommandError, call_command

from claims.models import AuditEntry
from gateway.models import Downstream, ToolRule
from tests.support.actors import make_actor
from tests.support.console import login

pytestmark = pytest.mark.django_db

SERVER = {"url": "https://tickets.internal/mcp", "prefix": "tk", "call_timeout_seconds": 20}


def _put(actor, path: str, body):
    return actor.client.put(f"/api/v1{path}", body, format="json")


@pytest.fixture
def operator(db):
    return make_actor("olivia-operator", "operator")


def test_an_operator_puts_a_server_and_a_rule_audited_and_the_console_shows_them(operator):
    server = _put(operator, "/gateway/downstreams/tickets", {**SERVER, "env": {"TOKEN": "s3cret"}})
    rule = _put(
        operator,
        "/gateway/rules/tickets/create_ticket",
        {
            "slot_from": "ARGUMENT",
            "slot_argument": "title",
            "query_tool": "find_ticket",
            "query_arguments": {"title": "$title"},
        },
    )

    assert server.status_code == 200, server.content
    assert server.json() | {"env": ["TOKEN"], "transport": "http", "source": "api"} == server.json()
    assert rule.status_code == 200 and rule.json()["slot_argument"] == "title"
    row = Downstream.objects.get(name="tickets")
    assert (row.prefix, row.url, row.call_timeout_seconds, row.env) == (
        "tk",
        SERVER["url"],
        20,
        {"TOKEN": "s3cret"},
    )
    assert ToolRule.objects.get(downstream="tickets", tool="create_ticket").query_tool == "find_ticket"
    audited = AuditEntry.objects.filter(principal="olivia-operator").values_list("action", "target")
    assert sorted(audited) == [
        ("mcp_downstream_save", "tickets"),
        ("mcp_tool_rule_set", "tickets/create_ticket"),
    ]
    assert "s3cret" not in json.dumps(list(AuditEntry.objects.values_list("detail", flat=True)))
    listed = operator.get("/gateway/downstreams").json()
    assert [d["name"] for d in listed] == ["tickets"] and "s3cret" not in json.dumps(listed)

    page = login("viewer").get("/gateway/")
    assert b"tickets" in page.content and b"create_ticket" in page.content


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**SERVER, "prefix": "a__b"}, "prefix"),
        ({**SERVER, "call_timeout_seconds": 0}, "call_timeout_seconds"),
        ({**SERVER, "call_timeout_seconds": "20"}, "call_timeout_seconds"),
        ({**SERVER, "command": [1, 2]}, "command"),
        ({"transport": "http"}, "url"),
        ({"transport": "stdio"}, "command"),
        ({**SERVER, "url": "ftp://x"}, "url"),
        ({**SERVER, "colour": "red"}, "colour"),
        ({**SERVER, "env": {"A": 1}}, "env"),
    ],
)
def test_a_bad_server_is_a_400_with_its_field_and_writes_nothing(operator, body, field):
    answer = _put(operator, "/gateway/downstreams/tickets", body)
    assert answer.status_code == 400, answer.content
    errors = answer.json().get("errors") or answer.json()
    assert field in json.dumps(errors)
    assert not Downstream.objects.exists() and not AuditEntry.objects.exists()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "SOMETIMES"}, "kind"),
        ({"slot_from": "ARGUMENT"}, "slot_argument"),
        ({"occurred_if": "TEXT_CONTAINS"}, "occurred_text"),
        ({"query_arguments": [1]}, "query_arguments"),
    ],
)
def test_a_bad_rule_is_a_400_with_its_field_and_writes_nothing(operator, body, field):
    answer = _put(operator, "/gateway/rules/tickets/create_ticket", body)
    assert answer.status_code == 400 and field in json.dumps(answer.json())
    assert not ToolRule.objects.exists() and not AuditEntry.objects.exists()


def test_only_operators_and_oncall_configure_the_gateway(db):
    for role, expected in (("worker", 403), ("oncall", 200)):
        actor = make_actor(f"someone-{role}", role)
        assert (
            _put(actor, f"/gateway/downstreams/s-{role}", SERVER | {"prefix": role}).status_code == expected
        )
        assert actor.get("/gateway/rules").status_code == (200 if role == "oncall" else 403)
    assert list(Downstream.objects.values_list("name", flat=True)) == ["s-oncall"]


def test_claimctl_gateway_applies_a_file_all_or_nothing_and_lists_it(operator, tmp_path, capsys):
    good = {
        "downstreams": [
            {"name": "tickets", **SERVER},
            {"name": "files", "command": ["npx", "server-filesystem"]},
        ],
        "rules": [{"downstream": "tickets", "tool": "create_ticket", "slot_from": "CALLER"}],
    }
    bad = {
        "downstreams": [{"name": "other", "url": "https://other.internal/mcp"}],
        "rules": [{"downstream": "other", "tool": "x", "slot_from": "ARGUMENT"}],  # no slot_argument
    }
    (tmp_path / "good.json").write_text(json.dumps(good))
    (tmp_path / "bad.json").write_text(json.dumps(bad))

    call_command("gateway", "apply", str(tmp_path / "good.json"), "--as", "olivia-operator")
    with pytest.raises(CommandError, match="slot_argument"):
        call_command("gateway", "apply", str(tmp_path / "bad.json"), "--as", "olivia-operator")
    with pytest.raises(CommandError, match="operator"):
        make_actor("agent-a", "worker")
        call_command("gateway", "apply", str(tmp_path / "good.json"), "--as", "agent-a")
    call_command(
        "gateway",
        "set-rule",
        "files",
        "write_file",
        "--slot-from",
        "ARGUMENT",
        "--slot-argument",
        "path",
        "--as",
        "olivia-operator",
    )
    capsys.readouterr()
    call_command("gateway", "list")
    listed = json.loads(capsys.readouterr().out)

    assert sorted(Downstream.objects.values_list("name", "transport")) == [
        ("files", "stdio"),
        ("tickets", "http"),
    ]
    assert sorted(ToolRule.objects.values_list("tool", "slot_from")) == [
        ("create_ticket", "CALLER"),
        ("write_file", "ARGUMENT"),
    ]
    assert sorted(d["name"] for d in listed["downstreams"]) == ["files", "tickets"]
    assert AuditEntry.objects.filter(principal="olivia-operator").count() == 4
