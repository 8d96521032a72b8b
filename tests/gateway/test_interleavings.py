"""Controlled interleavings of the gateway's read→write windows (acceptance.md's method, seed 003): services on
their own PostgreSQL connections, one paused at a named point while the other runs.

- A call finds another call of its slot in flight (an unlocked look) and, past the sender's timeout, records it
  lost (UNKNOWN). The sender may record its answer in between: whichever takes the effect and intent locks first
  decides, the other takes nothing — never both.
- Two first calls of one slot at once: one records the intent to send, the other finds it in flight (WAIT).
"""

from __future__ import annotations

import pytest

from claims import clock
from claims.models import DispatchIntent, Effect, Principal
from gateway.models import ToolCall
from gateway.selectors import DownstreamConfig
from gateway.services import call_begin, call_lost, call_plan, call_record
from tests.support.actors import make_actor
from tests.support.races import Pause, run_in_thread, wait_done_or_waiting, wait_for_lock_waiters

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

DOWNSTREAM = {"name": "counting", "prefix": "rec", "command": ["true"], "call_timeout_seconds": 2}


@pytest.fixture
def planned(settings, db):
    settings.MCP_DOWNSTREAMS = [DOWNSTREAM]
    settings.MCP_LOST_GRACE_SECONDS = 2
    operator, agent = make_actor("olivia-operator", "operator"), make_actor("agent-a", "worker")
    task_id = operator.create(node_id="n").json()["task_id"]
    claim = agent.claim(task_id).json()

    def plan():
        return call_plan(
            principal=Principal.objects.get(name="agent-a"),
            attempt_id=claim["attempt_id"],
            exposed="rec__create_record",
            arguments={"name": "x"},
            meta=None,
        )

    return plan


ANSWER = {"content": [{"type": "text", "text": "created"}], "isError": False}


def _config() -> DownstreamConfig:
    return DownstreamConfig(name="counting", prefix="rec", transport="stdio", call_timeout_seconds=2)


def test_a_sender_that_records_first_wins_over_a_lost_mark(planned):
    step = call_begin(planned())
    assert step.kind == "SEND"
    clock.travel(10)  # past the sender's timeout and grace: the waiter would call it lost
    pause = Pause("dispatch_apply.locked")
    sender, sent = run_in_thread(
        lambda: call_record(step=step, state="COMMITTED", result=ANSWER, external_ref="ok")
    )
    pause.wait_reached()  # the sender holds the effect and intent locks, not yet written
    waiter, lost = run_in_thread(lambda: call_lost(step=step, downstream=_config()))
    wait_for_lock_waiters(1)  # the lost mark queues behind the sender's locks
    pause.resume()
    sender.join(10)
    waiter.join(10)

    assert sent == {"value": "COMMITTED"} and lost == {"value": False}
    effect = Effect.objects.get()
    assert effect.state == "COMMITTED"
    assert list(effect.history.values_list("kind", flat=True)).count("delivered") == 1
    assert ToolCall.objects.get().result == ANSWER


def test_a_lost_mark_that_locks_first_wins_and_the_late_answer_changes_nothing(planned):
    step = call_begin(planned())
    clock.travel(10)
    pause = Pause("dispatch_apply.locked")
    waiter, lost = run_in_thread(lambda: call_lost(step=step, downstream=_config()))
    pause.wait_reached()
    sender, sent = run_in_thread(
        lambda: call_record(step=step, state="COMMITTED", result=ANSWER, external_ref="ok")
    )
    wait_done_or_waiting(sent, 1)
    pause.resume()
    waiter.join(10)
    sender.join(10)

    assert lost == {"value": True} and sent == {"value": "NOT_TAKEN"}
    effect = Effect.objects.get()
    assert effect.state == "UNKNOWN"  # the next call of the slot reconciles it before anything is sent again
    assert list(DispatchIntent.objects.values_list("state", "outcome")) == [("DELIVERED", "UNKNOWN")]
    assert ToolCall.objects.get().result is None


def test_a_sender_within_its_timeout_is_not_called_lost(planned):
    step = call_begin(planned())
    clock.travel(3)  # past the 2 s timeout, within timeout + grace

    assert call_lost(step=step, downstream=_config()) is False
    assert DispatchIntent.objects.get().state == "SENDING"


def test_two_first_calls_of_one_slot_at_once_send_once(planned):
    pause = Pause("effect_dispatch.checked")
    first, begun = run_in_thread(lambda: call_begin(planned()))
    pause.wait_reached()  # the first holds the task and effect locks, its intent not yet recorded
    second, other = run_in_thread(lambda: call_begin(planned()))
    wait_done_or_waiting(other, 1)
    pause.resume()
    first.join(10)
    second.join(10)

    kinds = sorted(box["value"].kind for box in (begun, other))
    assert kinds == ["SEND", "WAIT"]
    assert DispatchIntent.objects.count() == 1


def test_the_sweep_job_records_a_dead_senders_call_unknown_eagerly(planned):
    from gateway.tasks import sweep_lost_calls

    step = call_begin(planned())
    early = sweep_lost_calls.apply().get()
    clock.travel(10)
    late = sweep_lost_calls.apply().get()

    assert (early, late) == ({"lost": 0}, {"lost": 1})
    assert Effect.objects.get(pk=step.effect_id).state == "UNKNOWN"


def test_the_sweep_job_runs_on_a_real_worker(celery_workers, planned):
    """Through the broker to a real ``celery worker`` process, on its own clock: the dead sender's window (2 s timeout
    + 2 s grace, in the worker's settings) passes in real time."""
    import json
    import time

    from gateway.tasks import sweep_lost_calls
    from tests.support.processes import wait_for

    step = call_begin(planned())
    celery_workers.start(MCP_DOWNSTREAMS=json.dumps([DOWNSTREAM]), MCP_LOST_GRACE_SECONDS="2")
    time.sleep(4.2)

    def swept() -> bool:
        sweep_lost_calls.delay()
        time.sleep(0.5)
        return Effect.objects.get(pk=step.effect_id).state == "UNKNOWN"

    assert wait_for(swept, seconds=30), celery_workers.log()
    assert list(DispatchIntent.objects.values_list("state", "outcome")) == [("DELIVERED", "UNKNOWN")]
