"""What a model reads when the gateway refuses, and how a call recovers from what went wrong downstream: a payload
conflict, an operator's approval, an UNKNOWN outcome that did not happen, a gateway killed mid-call, bad tokens.
Real parts as in test_exactly_once.py; the counting server's ledger file is what is counted."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest

from claims.models import DispatchIntent, Effect, Principal
from claims.services import effect_approve
from gateway.models import ToolCall
from tests.gateway.support import META, call, outcome, text

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RECORD = "rec__create_record"
QUERY_RULE = {
    "downstream": "counting",
    "tool": "create_record",
    "query_tool": "find_record",
    "query_arguments": {"name": "$name"},
}


def _claimed(operator, worker, **fields) -> dict:
    task_id = operator.create(node_id="write-report", **fields).json()["task_id"]
    return worker.claim(task_id).json()


def test_another_payload_for_the_same_slot_is_a_payload_conflict_tool_error(shared_gateway, people):
    rules = [
        {"downstream": "counting", "tool": "create_record", "slot_from": "ARGUMENT", "slot_argument": "name"}
    ]
    gw = shared_gateway(rules=rules)
    operator, agent = people
    claim = _claimed(operator, agent)

    first = call(gw.url, agent.token, claim["attempt_id"], RECORD, {"name": "ticket-9", "body": "first"})
    changed = call(gw.url, agent.token, claim["attempt_id"], RECORD, {"name": "ticket-9", "body": "second"})

    assert not first.is_error
    assert outcome(changed) == "PAYLOAD_CONFLICT"
    bound = Effect.objects.get().payload_digest
    assert changed.structured_content["current"]["bound_payload_digest"] == bound
    assert "Do not change the arguments" in text(changed)
    assert [r["body"] for r in gw.records()] == ["first"]


def test_a_caller_given_slot_binds_the_payload_too(shared_gateway, people):
    gw = shared_gateway()
    operator, agent = people
    claim = _claimed(operator, agent)
    slot = {META + "effect_slot": "the-welcome-mail"}

    first = call(gw.url, agent.token, claim["attempt_id"], RECORD, {"name": "mail", "body": "hi"}, meta=slot)
    again = call(gw.url, agent.token, claim["attempt_id"], RECORD, {"name": "mail", "body": "hi"}, meta=slot)
    other = call(gw.url, agent.token, claim["attempt_id"], RECORD, {"name": "mail", "body": "HI!"}, meta=slot)

    assert not first.is_error and again.meta[META + "replayed"] is True
    assert outcome(other) == "PAYLOAD_CONFLICT"
    assert len(gw.records()) == 1


def test_a_non_replayable_tool_runs_only_after_an_operator_approves_it(shared_gateway, people):
    gw = shared_gateway(rules=[{"downstream": "counting", "tool": "create_record", "kind": "NON_REPLAYABLE"}])
    operator, agent = people
    claim = _claimed(operator, agent)
    args = {"name": "wire-transfer", "body": "100 EUR"}

    waiting = call(gw.url, agent.token, claim["attempt_id"], RECORD, args)
    assert outcome(waiting) == "APPROVAL_REQUIRED" and gw.records() == []
    effect = Effect.objects.get()
    assert effect.non_replayable and effect.approved_at is None

    effect_approve(principal=Principal.objects.get(name=operator.name), effect_id=effect.pk, note="checked")
    approved = call(gw.url, agent.token, claim["attempt_id"], RECORD, args)
    again = call(gw.url, agent.token, claim["attempt_id"], RECORD, args)

    assert not approved.is_error and again.meta[META + "replayed"] is True
    assert len(gw.records()) == 1


def test_an_unknown_call_that_did_not_happen_is_sent_again_under_the_same_key(
    shared_gateway, people, tmp_path
):
    """The first call stalls before acting and times out (UNKNOWN); the gateway's cancel stops it downstream. The next
    call's query finds nothing (NOT_OCCURRED): the effect is PREPARED again and sent once more — one record."""
    gw = shared_gateway(rules=[QUERY_RULE])
    operator, agent = people
    claim = _claimed(operator, agent)
    stall = tmp_path / "stall-once"
    stall.touch()
    args = {"name": "late-start", "slow_once": str(stall)}

    first = call(gw.url, agent.token, claim["attempt_id"], RECORD, args)
    assert outcome(first) == "UNKNOWN"
    time.sleep(3)  # past when the stalled call would have acted, had it not been cancelled
    second = call(gw.url, agent.token, claim["attempt_id"], RECORD, args)

    assert not second.is_error and text(second) == "created record 1 named late-start"
    assert len(gw.records()) == 1
    effect = Effect.objects.get()
    assert effect.state == "COMMITTED"
    kinds = list(effect.history.values_list("kind", flat=True))
    assert kinds.count("dispatch_recorded") == 2 and "reconciled" in kinds
    assert ToolCall.objects.get().sends == 2
    assert len({d.pk for d in effect.dispatches.all()}) == 2  # two sends, one key: the effect's


def test_a_gateway_killed_mid_call_leaves_an_unknown_that_the_next_call_reconciles(gateway_server, people):
    """The app server dies while the tool is answering (it had acted). Its intent stays SENDING; a new server's call
    of the slot waits out the sender's timeout, records it UNKNOWN (lost), asks the server, and answers that it
    happened — no second record."""
    gw = gateway_server(rules=[QUERY_RULE], processes=1)
    operator, agent = people
    claim = _claimed(operator, agent)
    args = {"name": "half-way", "sleep_after": 1.5}

    def kill_soon():
        deadline = time.monotonic() + 20
        while (
            not gw.records() and time.monotonic() < deadline
        ):  # the tool has acted; its answer is 1.5 s away
            time.sleep(0.05)
        for pid in gw.server.worker_pids():
            os.kill(pid, signal.SIGKILL)
        os.killpg(os.getpgid(gw.server.proc.pid), signal.SIGKILL)

    killer = threading.Thread(target=kill_soon)
    killer.start()
    with pytest.raises(Exception):  # noqa: B017 - the connection dies with the server
        call(gw.url, agent.token, claim["attempt_id"], RECORD, args)
    killer.join()
    assert DispatchIntent.objects.get().state == "SENDING"

    fresh = gateway_server(rules=[QUERY_RULE], processes=1)
    fresh.ledger.write_text(gw.ledger.read_text())  # the same downstream system
    answer = call(fresh.url, agent.token, claim["attempt_id"], RECORD, args)

    assert outcome(answer) == "ALREADY_COMMITTED"
    assert len(fresh.records()) == 1
    effect = Effect.objects.get()
    assert effect.state == "COMMITTED"
    assert list(effect.dispatches.values_list("state", "outcome")) == [("DELIVERED", "UNKNOWN")]


def test_the_endpoint_wants_a_workers_token(shared_gateway, people):
    gw = shared_gateway()
    operator, agent = people
    claim = _claimed(operator, agent)
    endpoint = f"{gw.url}/mcp/attempts/{claim['attempt_id']}"
    ping = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    accept = {"Accept": "application/json, text/event-stream"}

    none = httpx.post(endpoint, json=ping, headers=accept)
    wrong = httpx.post(endpoint, json=ping, headers={**accept, "Authorization": "Bearer nope"})
    operators = httpx.post(
        endpoint, json=ping, headers={**accept, "Authorization": f"Bearer {operator.token}"}
    )
    not_uuid = httpx.post(
        f"{gw.url}/mcp/attempts/42", json=ping, headers={**accept, "Authorization": f"Bearer {agent.token}"}
    )

    assert (none.status_code, none.headers["www-authenticate"]) == (401, 'Bearer realm="mcp"')
    assert wrong.status_code == 401 and operators.status_code == 403 and not_uuid.status_code == 404
    assert none.json()["error"]


def test_concurrent_retries_of_an_unknown_call_reconcile_once_and_send_once(shared_gateway, people, tmp_path):
    """Four retries at once of a call that timed out before acting: each asks the query, one reconcile wins (the
    others find the effect no longer UNKNOWN), one of them sends, the rest wait for its answer — one record."""
    from tests.gateway.support import calls_at_once

    gw = shared_gateway(rules=[QUERY_RULE])
    operator, agent = people
    claim = _claimed(operator, agent)
    stall = tmp_path / "stall-once"
    stall.touch()
    args = {"name": "retried-at-once", "slow_once": str(stall)}
    assert outcome(call(gw.url, agent.token, claim["attempt_id"], RECORD, args)) == "UNKNOWN"
    time.sleep(3)
    answers = calls_at_once(4, gw.url, agent.token, claim["attempt_id"], RECORD, args)

    assert [a.is_error for a in answers] == [False] * 4
    assert {text(a) for a in answers} == {"created record 1 named retried-at-once"}
    assert len(gw.records()) == 1
    assert Effect.objects.get().history.filter(kind="reconciled").count() == 1
