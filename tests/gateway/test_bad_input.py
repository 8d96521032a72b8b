"""Bad input to the MCP endpoint gets a clear error and changes nothing: malformed JSON, arguments that are not an
object or not plain JSON, absurd nesting, broken escapes — a JSON-RPC error or a tool error, never a 500 and never
a database message; no effect, no tool call, nothing downstream."""

from __future__ import annotations

import httpx
import pytest

from claims.models import Effect
from gateway.models import ToolCall
from tests.support.actors import make_actor

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

CALL = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"rec__create_record","arguments":%s}}'
BODIES = [
    "not json",
    CALL % "[1, 2]",
    CALL % '{"name": NaN}',
    CALL % '{"name": Infinity}',
    CALL % ('{"name": "x", "body": ' + "[" * 3000 + "]" * 3000 + "}"),
    '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"\\ud800","arguments":{}}}',
    '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"rec__create_record","arguments":{"name":"\\ud800"}}}',
    '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":7}}',
    '{"jsonrpc":"2.0","id":1,"method":"tools/call"}',
    "[]",
    "\xff\xfe".encode("latin-1").decode("latin-1"),
]


def test_bad_bodies_are_answered_as_errors_and_change_nothing(gateway_server):
    gw = gateway_server()
    operator, agent = make_actor("olivia-operator", "operator"), make_actor("agent-a", "worker")
    claim = agent.claim(operator.create(node_id="n").json()["task_id"]).json()
    headers = {
        "Authorization": f"Bearer {agent.token}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2025-11-25",
    }

    answers = [
        httpx.post(
            f"{gw.url}/mcp/attempts/{claim['attempt_id']}",
            content=body.encode("utf-8", "surrogatepass"),
            headers=headers,
            timeout=30,
        )
        for body in BODIES
    ]

    for body, answer in zip(BODIES, answers, strict=True):
        assert answer.status_code in (200, 400, 406, 415, 422), (
            body[:60],
            answer.status_code,
            answer.text[:300],
        )
        assert "error" in answer.text or '"isError":true' in answer.text, (body[:60], answer.text[:300])
        assert "DETAIL" not in answer.text and "psycopg" not in answer.text and "Traceback" not in answer.text
    assert not Effect.objects.exists() and not ToolCall.objects.exists() and gw.records() == []
