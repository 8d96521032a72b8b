"""The idempotency key travels to every downstream call (``_meta`` dev.claim-control-plane/idempotency_key and the
``Idempotency-Key`` header, equal to the effect id, the same on every resend); a long call reporting progress is not
timed out and a repeat waits for its answer; and the small defects of a first week: bad ``_meta`` values, an epoch
of 0, an answer over the ledger's limit, a tool the server does not have. Real parts as in test_exactly_once.py."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from mcp import types

from claims.models import DispatchIntent, Effect
from gateway.models import ToolCall
from tests.gateway.support import META, agent_session, call, outcome, run_async, text
from tests.gateway.test_downstreams_come_and_go import http_downstream
from tests.gateway.test_refusals_and_recovery import QUERY_RULE

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RECORD = "rec__create_record"
KEY = META + "idempotency_key"


def _claim(operator, agent) -> str:
    return agent.claim(operator.create(node_id="n").json()["task_id"]).json()["attempt_id"]


def _ledger(path) -> list[dict]:
    return (
        [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    )


def _http_gateway(gateway_server, downstream, *, timeout: float = 2.0, rules=None, **env):
    return gateway_server(
        downstreams=[
            {"name": "counting", "prefix": "rec", "url": downstream.url, "call_timeout_seconds": timeout}
        ],
        rules=rules,
        **env,
    )


def test_the_effect_id_travels_in_meta_and_as_a_header_the_same_on_every_resend(
    gateway_server, people, tmp_path
):
    operator, agent = people
    with http_downstream(tmp_path) as downstream:
        gw = _http_gateway(gateway_server, downstream)
        attempt = _claim(operator, agent)
        assert not call(gw.url, agent.token, attempt, RECORD, {"name": "plain"}).is_error
        # a definite refusal (FAILED) lets a later call send the effect again: two sends, one key
        for _ in range(2):
            assert call(gw.url, agent.token, attempt, "rec__always_fails", {"reason": "twice"}).is_error

    rows = _ledger(downstream.ledger)
    plain = ToolCall.objects.get(tool="create_record").effect_id
    twice = ToolCall.objects.get(tool="always_fails").effect_id
    assert [(r["tool"], r["key"], r["header_key"]) for r in rows] == [
        ("create_record", plain, plain),
        ("always_fails", twice, twice),
        ("always_fails", twice, twice),
    ]
    assert Effect.objects.get(pk=twice).dispatches.count() == 2


def test_the_key_reaches_a_stdio_server_in_meta(gateway_server, people):
    operator, agent = people
    gw = gateway_server()
    attempt = _claim(operator, agent)
    assert not call(gw.url, agent.token, attempt, RECORD, {"name": "over-stdio"}).is_error
    (row,) = gw.records()
    assert row["key"] == ToolCall.objects.get().effect_id and row["header_key"] == ""


@pytest.mark.parametrize("honours", [True, False], ids=["honours-the-key", "ignores-the-key"])
def test_a_downstream_that_acts_after_the_timeout_makes_one_row_when_it_honours_the_key(
    gateway_server, people, tmp_path, honours
):
    """The window docs/mcp.md names: the first send times out and the server acts 3 s later anyway, ignoring the
    cancellation; the caller retries at once, the query finds nothing yet, and the gateway sends again under the
    same key. A server that honours the key makes one record; one that ignores it makes two (the remaining window)."""
    operator, agent = people
    late = tmp_path / "late"
    late.touch()
    flags = ("--honour-key",) if honours else ()
    with http_downstream(tmp_path, *flags) as downstream:
        gw = _http_gateway(gateway_server, downstream, rules=[QUERY_RULE])
        attempt = _claim(operator, agent)
        args = {"name": "late", "late_once": str(late)}
        assert outcome(call(gw.url, agent.token, attempt, RECORD, args)) == "UNKNOWN"
        assert not call(gw.url, agent.token, attempt, RECORD, args).is_error  # NOT_OCCURRED, sent again
        time.sleep(3.5)  # the first send acts now

    assert len(_ledger(downstream.ledger)) == (1 if honours else 2)
    assert len({row["key"] for row in _ledger(downstream.ledger)}) == 1


LONG_SECONDS = float(os.environ.get("GATEWAY_LONG_CALL_SECONDS", "20"))


def test_a_long_call_reporting_progress_runs_past_its_timeout_and_a_repeat_waits_for_its_answer(
    gateway_server, people, tmp_path
):
    """A call of LONG_SECONDS (five minutes with GATEWAY_LONG_CALL_SECONDS=300) against a 2 s timeout that reports
    progress every second: the caller receives the progress, the call is recorded once with its final answer, and
    a repeat made half-way on another connection waits and gets that answer — nothing recorded lost or UNKNOWN. The
    agent is a healthy owner: it renews its 30 s lease while the call runs (an expired lease would make the repeat
    FENCED, as it should)."""
    operator, agent = people
    with http_downstream(tmp_path) as downstream:
        gw = _http_gateway(gateway_server, downstream, timeout=2.0, MCP_HEARD_EVERY_SECONDS="1")
        claim = agent.claim(operator.create(node_id="n").json()["task_id"]).json()
        attempt, running = claim["attempt_id"], threading.Event()
        args = {"name": "long", "seconds": LONG_SECONDS, "every": 1.0}
        progress: list[float] = []
        answers: dict[str, types.CallToolResult] = {}

        async def first() -> None:
            async def seen(done: float, total: float | None, message: str | None) -> None:
                progress.append(done)

            async with agent_session(gw.url, agent.token, attempt, timeout=LONG_SECONDS + 60) as session:
                answers["first"] = await session.call_tool(
                    "rec__long_task", args, progress_callback=seen, meta={"progressToken": "p-1"}
                )

        async def repeat() -> None:
            async with agent_session(gw.url, agent.token, attempt, timeout=LONG_SECONDS + 60) as session:
                answers["repeat"] = await session.call_tool("rec__long_task", args)

        def renew() -> None:
            while not running.wait(5):
                assert agent.renew(claim).status_code == 200

        runner, renewer = threading.Thread(target=run_async, args=(first,)), threading.Thread(target=renew)
        runner.start()
        renewer.start()
        time.sleep(LONG_SECONDS / 2)
        run_async(repeat)
        runner.join()
        running.set()
        renewer.join()

    assert not answers["first"].is_error and text(answers["first"]) == "created record 1 named long"
    assert text(answers["repeat"]) == text(answers["first"])
    assert len(progress) >= LONG_SECONDS * 0.7  # every second's progress reached the caller
    assert len(_ledger(downstream.ledger)) == 1
    (intent,) = DispatchIntent.objects.all()
    assert (intent.outcome, intent.heard_at is not None) == ("COMMITTED", True)
    assert ToolCall.objects.get().sends == 1 and Effect.objects.get().state == "COMMITTED"


def test_bad_meta_values_are_invalid_and_an_epoch_of_zero_is_checked(shared_gateway, people):
    gw = shared_gateway()
    operator, agent = people
    attempt = _claim(operator, agent)
    for given in ("seven", 1.5, -1, True, [1]):
        answer = call(
            gw.url, agent.token, attempt, RECORD, {"name": "x"}, meta={META + "claim_generation": given}
        )
        assert outcome(answer) == "INVALID", answer.content
    answer = call(gw.url, agent.token, attempt, RECORD, {"name": "x"}, meta={META + "scheduler_epoch": 0})
    assert answer.structured_content["outcome"] == "FENCED" and answer.structured_content["reason"] == "EPOCH"
    assert not Effect.objects.exists() and gw.records() == []


def test_a_tool_the_server_does_not_have_records_nothing(shared_gateway, people):
    gw = shared_gateway()
    operator, agent = people
    answer = call(gw.url, agent.token, _claim(operator, agent), "rec__no_such_tool", {"name": "x"})
    assert outcome(answer) == "NOT_FOUND"
    assert (
        not Effect.objects.exists() and not ToolCall.objects.exists() and not DispatchIntent.objects.exists()
    )


def test_an_answer_over_the_ledgers_limit_reaches_its_caller_and_is_recorded_as_happened(
    gateway_server, people, tmp_path
):
    """1.2 MB of text over Streamable HTTP (before: UNKNOWN "did not answer in time", ~1 MiB stored)."""
    operator, agent = people
    with http_downstream(tmp_path) as downstream:
        gw = _http_gateway(gateway_server, downstream, timeout=10.0)
        attempt = _claim(operator, agent)
        args = {"name": "big", "size": 1_200_000}

        async def big() -> (
            types.CallToolResult
        ):  # a caller that reads SSE events past the SDK's 1 MiB default
            async with agent_session(gw.url, agent.token, attempt, max_event=4 << 20) as session:
                return await session.call_tool("rec__big_answer", args)

        first = run_async(big)
        again = call(gw.url, agent.token, attempt, "rec__big_answer", args)

    assert not first.is_error and len(text(first)) == 1_200_000
    assert outcome(again) == "ALREADY_COMMITTED"
    assert len(_ledger(downstream.ledger)) == 1
    recorded = ToolCall.objects.get()
    assert recorded.result is None and Effect.objects.get().state == "COMMITTED"
    assert "not kept" in Effect.objects.get().external_ref


def test_arguments_over_the_apis_limit_are_invalid_and_nothing_is_stored(shared_gateway, people):
    """1.1 MB of arguments (CLAIMS_MAX_VALUE_BYTES is 1 MB): the API would refuse them; so does the gateway, before
    it records the effect, the intent and the tool call (each of which holds the arguments)."""
    gw = shared_gateway()
    operator, agent = people
    answer = call(
        gw.url, agent.token, _claim(operator, agent), RECORD, {"name": "big", "body": "x" * 1_100_000}
    )
    assert outcome(answer) == "INVALID" and "CLAIMS_MAX_VALUE_BYTES" in text(answer)
    assert not Effect.objects.exists() and not ToolCall.objects.exists() and gw.records() == []
