"""Every tool call through the gateway is an effect of the caller's claim: a repeat — a new JSON-RPC id, a new
connection, a retry after a timeout or a disconnect, a takeover attempt — gets the recorded answer and never reaches
the downstream server twice (docs/mcp.md). Real parts: the production server (gunicorn, two uvicorn processes) on
PostgreSQL, the official MCP client, our counting server as a stdio downstream; the effect target's own ledger file
is what is counted."""

from __future__ import annotations

import time

import anyio
import pytest

from claims.models import Effect, EffectEvent, Principal, Task
from claims.services import epoch_fence, namespace_resume
from gateway.models import ToolCall
from tests.gateway.support import META, call, call_once, calls_at_once, outcome, run_async, text
from tests.support.actors import make_actor

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RECORD = "rec__create_record"


@pytest.fixture
def people(db):
    operator = make_actor("olivia-operator", "operator")
    return operator, make_actor("agent-a", "worker"), make_actor("agent-b", "worker")


def _claimed(operator, worker, *, ttl: int = 30, epoch: int = 1) -> dict:
    task_id = operator.create(node_id="write-report").json()["task_id"]
    reply = worker.claim(task_id, ttl=ttl, epoch=epoch)
    assert reply.status_code == 200, reply.content
    return reply.json()


def test_a_call_retried_on_new_connections_reaches_the_tool_once(shared_gateway, people):
    gw = shared_gateway()
    operator, agent, _ = people
    claim = _claimed(operator, agent)
    args = {"name": "invoice-17", "body": "total 40"}

    answers = [call(gw.url, agent.token, claim["attempt_id"], RECORD, args) for _ in range(3)]

    assert [r.is_error for r in answers] == [False, False, False]
    assert {text(r) for r in answers} == {"created record 1 named invoice-17"}
    assert [r.meta and r.meta.get(META + "replayed") for r in answers] == [None, True, True]
    assert len(gw.records()) == 1
    effect = Effect.objects.get()
    assert effect.state == "COMMITTED" and effect.task_id == claim["task_id"]
    recorded = ToolCall.objects.get(pk=effect.pk)
    assert (recorded.tool, recorded.arguments, recorded.sends) == ("create_record", args, 1)
    assert effect.dispatches.count() == 1


def test_concurrent_duplicates_of_one_call_send_once_and_all_get_its_answer(shared_gateway, people):
    gw = shared_gateway()
    operator, agent, _ = people
    claim = _claimed(operator, agent)
    args = {"name": "ticket", "body": "printer on fire", "sleep_after": 0.5}
    answers = calls_at_once(8, gw.url, agent.token, claim["attempt_id"], RECORD, args)

    assert len(gw.records()) == 1
    assert [r.is_error for r in answers] == [False] * 8
    assert {text(r) for r in answers} == {"created record 1 named ticket"}
    assert ToolCall.objects.get().sends == 1


def test_two_agents_racing_on_one_task_after_a_takeover_send_once(shared_gateway, people):
    """agent-a's lease ran out and agent-b took the task over; both call the same tool at once. agent-a is refused
    (FENCED) before anything is sent; agent-b's call runs once."""
    gw = shared_gateway()
    operator, agent_a, agent_b = people
    first = _claimed(operator, agent_a, ttl=1)
    time.sleep(1.3)
    second = agent_b.claim(first["task_id"]).json()
    args = {"name": "deploy", "body": "v2"}
    answers: dict = {}

    async def race():
        async def one(who, token, attempt):
            answers[who] = await call_once(gw.url, token, attempt, RECORD, args)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one, "a", agent_a.token, first["attempt_id"])
            tg.start_soon(one, "b", agent_b.token, second["attempt_id"])

    run_async(race)

    assert outcome(answers["a"]) == "FENCED"
    assert "do not retry" in text(answers["a"])
    assert not answers["b"].is_error
    assert len(gw.records()) == 1


def test_a_takeover_attempt_gets_the_recorded_answer_instead_of_a_second_call(shared_gateway, people):
    gw = shared_gateway()
    operator, agent_a, agent_b = people
    first = _claimed(operator, agent_a, ttl=1)
    args = {"name": "mail-to-bob", "body": "hello"}
    done = call(gw.url, agent_a.token, first["attempt_id"], RECORD, args)
    time.sleep(1.3)  # agent-a stalls; its lease runs out
    second = agent_b.claim(first["task_id"]).json()

    again = call(gw.url, agent_b.token, second["attempt_id"], RECORD, args)
    late = call(gw.url, agent_a.token, first["attempt_id"], RECORD, args)

    assert text(again) == text(done) and again.meta[META + "replayed"] is True
    assert outcome(late) == "FENCED"
    assert len(gw.records()) == 1


def test_a_fenced_or_expired_attempt_is_refused_before_anything_is_sent(shared_gateway, people):
    gw = shared_gateway()
    operator, agent_a, agent_b = people
    fenced = _claimed(operator, agent_a)
    expired = _claimed(operator, agent_b, ttl=1)
    epoch_fence(
        principal=Principal.objects.get(name=operator.name), namespace="default", reason="incident drill"
    )
    time.sleep(1.2)

    after_fence = call(gw.url, agent_a.token, fenced["attempt_id"], RECORD, {"name": "x"})
    after_expiry = call(gw.url, agent_b.token, expired["attempt_id"], RECORD, {"name": "y"})

    assert (outcome(after_fence), after_fence.structured_content["reason"]) == ("FENCED", "EPOCH")
    assert outcome(after_expiry) == "FENCED"
    assert after_expiry.structured_content["reason"] in ("EPOCH", "LEASE_EXPIRED")
    assert gw.records() == []
    assert not Effect.objects.exists()


def test_a_fence_in_the_middle_of_a_call_lets_the_call_finish_once_and_refuses_what_follows(
    shared_gateway, people
):
    """The intent to send was recorded before the fence, so the order of records lets that call finish (and be
    recorded); the fenced attempt's next call is refused, and the attempt after the fence gets the answer."""
    gw = shared_gateway()
    operator, agent_a, agent_b = people
    claim = _claimed(operator, agent_a)
    args = {"name": "slow-write", "sleep_after": 1.0}
    answers: list = []

    async def fence_mid_call():
        async def slow():
            answers.append(await call_once(gw.url, agent_a.token, claim["attempt_id"], RECORD, args))

        async with anyio.create_task_group() as tg:
            tg.start_soon(slow)
            await anyio.sleep(0.5)
            await anyio.to_thread.run_sync(
                lambda: epoch_fence(
                    principal=Principal.objects.get(name=operator.name),
                    namespace="default",
                    reason="mid-call",
                )
            )

    run_async(fence_mid_call)
    retry = call(gw.url, agent_a.token, claim["attempt_id"], RECORD, args)
    namespace_resume(principal=Principal.objects.get(name=operator.name), namespace="default", reason="fixed")
    after = agent_b.claim(claim["task_id"], epoch=2).json()
    replay = call(gw.url, agent_b.token, after["attempt_id"], RECORD, args)

    assert not answers[0].is_error
    assert outcome(retry) == "FENCED"
    assert text(replay) == text(answers[0])
    assert len(gw.records()) == 1
    assert Effect.objects.get().state == "COMMITTED"


def test_a_client_that_hangs_up_mid_call_gets_the_recorded_answer_on_its_retry(shared_gateway, people):
    gw = shared_gateway()
    operator, agent, _ = people
    claim = _claimed(operator, agent)
    args = {"name": "hang-up", "sleep_after": 1.0}

    async def hang_up():
        with anyio.move_on_after(0.4):
            await call_once(gw.url, agent.token, claim["attempt_id"], RECORD, args)

    run_async(hang_up)
    time.sleep(1.2)
    retry = call(gw.url, agent.token, claim["attempt_id"], RECORD, args)

    assert text(retry) == "created record 1 named hang-up" and retry.meta[META + "replayed"] is True
    assert len(gw.records()) == 1
    assert ToolCall.objects.get().sends == 1


def test_a_timeout_is_unknown_and_the_next_call_reconciles_through_the_query_rule(shared_gateway, people):
    """The tool acted but answered after the gateway's timeout: UNKNOWN, never FAILED. The next call asks the
    server (the operator's query rule: find_record by the call's name) and, since it happened, records COMMITTED and
    answers so — without a second send."""
    rules = [
        {
            "downstream": "counting",
            "tool": "create_record",
            "query_tool": "find_record",
            "query_arguments": {"name": "$name"},
        }
    ]
    gw = shared_gateway(rules=rules)
    operator, agent, _ = people
    claim = _claimed(operator, agent)
    args = {"name": "late-answer", "sleep_after": 3.0}

    first = call(gw.url, agent.token, claim["attempt_id"], RECORD, args)
    assert outcome(first) == "UNKNOWN" and "may have acted" in text(first)
    assert Effect.objects.get().state == "UNKNOWN"

    second = call(gw.url, agent.token, claim["attempt_id"], RECORD, args)

    assert outcome(second) == "ALREADY_COMMITTED" and "do not run it again" in text(second)
    effect = Effect.objects.get()
    assert effect.state == "COMMITTED"
    assert list(EffectEvent.objects.filter(effect=effect).values_list("kind", flat=True)) == [
        "prepared",
        "dispatch_recorded",
        "delivered",
        "prepare_seen",
        "reconciled",
        "prepare_seen",
    ]
    assert len(gw.records()) == 1


def test_a_read_only_tool_passes_through_unrecorded(shared_gateway, people):
    rules = [{"downstream": "counting", "tool": "count", "kind": "READ_ONLY"}]
    gw = shared_gateway(rules=rules)
    operator, agent, _ = people
    claim = _claimed(operator, agent)

    answers = [call(gw.url, agent.token, claim["attempt_id"], "rec__count", {}) for _ in range(2)]

    assert [text(r) for r in answers] == ["0", "0"]
    assert not Effect.objects.exists() and not ToolCall.objects.exists()


def test_calls_name_their_claim_by_endpoint_or_meta_and_act_only_as_their_token(shared_gateway, people):
    gw = shared_gateway()
    operator, agent_a, agent_b = people
    claim = _claimed(operator, agent_a)

    by_meta = call(
        gw.url, agent_a.token, None, RECORD, {"name": "m"}, meta={META + "attempt_id": claim["attempt_id"]}
    )
    unnamed = call(gw.url, agent_a.token, None, RECORD, {"name": "n"})
    not_hers = call(gw.url, agent_b.token, claim["attempt_id"], RECORD, {"name": "o"})

    assert not by_meta.is_error
    assert outcome(unnamed) == "INVALID" and "/mcp/attempts/" in text(unnamed)
    assert outcome(not_hers) == "FORBIDDEN"
    assert len(gw.records()) == 1
    assert Task.objects.get().state == "CLAIMED"


def test_the_sdks_high_level_client_on_the_2026_protocol_gets_the_same_protection(shared_gateway, people):
    """``mcp.client.Client`` (mode auto) speaks the 2026-07-28 revision: no session, a new request id every time,
    and a silent resend on a header mismatch — every repeat is still the one effect."""
    import httpx2
    from mcp.client import Client
    from mcp.client.streamable_http import streamable_http_client

    gw = shared_gateway()
    operator, agent, _ = people
    claim = _claimed(operator, agent)
    endpoint = f"{gw.url}/mcp/attempts/{claim['attempt_id']}"

    async def twice():
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {agent.token}"}) as http:
            async with Client(
                streamable_http_client(endpoint, http_client=http), mode="auto", cache=None
            ) as client:
                first = await client.call_tool(RECORD, {"name": "modern"})
                again = await client.call_tool(RECORD, {"name": "modern"})
                return client, first, again

    client, first, again = run_async(twice)

    assert not first.is_error and again.meta[META + "replayed"] is True
    assert text(first) == text(again)
    assert len(gw.records()) == 1


def test_a_recorded_read_only_tool_answers_its_first_read_again(shared_gateway, people):
    rules = [{"downstream": "counting", "tool": "count", "kind": "READ_ONLY", "record_reads": True}]
    gw = shared_gateway(rules=rules)
    operator, agent, _ = people
    claim = _claimed(operator, agent)

    before = call(gw.url, agent.token, claim["attempt_id"], "rec__count", {})
    call(gw.url, agent.token, claim["attempt_id"], RECORD, {"name": "one more"})
    again = call(gw.url, agent.token, claim["attempt_id"], "rec__count", {})

    assert text(before) == text(again) == "0"  # the task's own read, as first seen
    assert ToolCall.objects.filter(tool="count").count() == 1


def test_duplicates_of_a_call_the_tool_refused_get_its_refusal_and_do_not_run_it_again(
    shared_gateway, people
):
    """A definite refusal (isError) is FAILED: a later call may run the tool again under the same key — but the
    duplicates that were waiting on the refused call get its answer, as its original caller did."""
    gw = shared_gateway()
    operator, agent, _ = people
    claim = _claimed(operator, agent)
    args = {"reason": "quota", "sleep": 0.5}
    answers = calls_at_once(6, gw.url, agent.token, claim["attempt_id"], "rec__always_fails", args)

    assert [r.is_error for r in answers] == [True] * 6
    assert {text(r) for r in answers} == {text(answers[0])}
    assert [r["tool"] for r in gw.records()] == ["always_fails"]
    later = call(gw.url, agent.token, claim["attempt_id"], "rec__always_fails", args)
    assert later.is_error and len(gw.records()) == 2  # after the refusal, a new call may try again
