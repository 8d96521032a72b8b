"""The worker SDK (claim-client, clients/python) against a live server: typed outcomes, background renewal that stops when
fenced, remaining(), and the effect helper that reconciles after a takeover instead of calling again."""

from __future__ import annotations

import time

import claim_client as sdk
import httpx
import pytest

from claims.models import Effect, Task, TaskEvent
from tests.support.actors import ensure_default_namespace, make_actor

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server(live_server):
    ensure_default_namespace()
    return live_server.url


def _sdk(server, actor) -> sdk.ControlPlane:
    return sdk.ControlPlane(server, actor.token, owner_id=actor.name, timeout=5)


@pytest.fixture
def op():
    return make_actor("olivia-operator", "operator")


def test_claim_stage_commit_and_a_late_commit_raises_fenced(server, op, db_clock):
    task_id = op.create(node_id="parse", input={"file": "g.y"}).json()["task_id"]
    a = _sdk(server, make_actor("worker-a", "worker"))
    b = _sdk(server, make_actor("worker-b", "worker"))

    claim_a = a.claim(task_id, scheduler_epoch=1, ttl_seconds=5)
    a.stage(claim_a, {"ast": "a"})
    db_clock.travel(6)
    claim_b = b.claim_next(scheduler_epoch=1, ttl_seconds=30)
    b.stage(claim_b, {"ast": "b"})
    committed = b.commit(claim_b, {"ast": "b"})

    with pytest.raises(sdk.Fenced) as late:
        a.commit(claim_a, {"ast": "a"})
    assert late.value.reason == "GENERATION" and late.value.current["claim_generation"] == 2
    assert claim_b.input == {"file": "g.y"} and committed.unblocked == []
    assert Task.objects.get(pk=task_id).result == {"ast": "b"}
    assert b.claim_next(scheduler_epoch=1, ttl_seconds=30) is None


@pytest.mark.parametrize(
    ("act", "error", "reason"),
    [
        (lambda cp, t: cp.claim(t, scheduler_epoch=9, ttl_seconds=5), sdk.Fenced, "EPOCH"),
        (
            lambda cp, t: cp.claim(t, scheduler_epoch=1, ttl_seconds=5, expected_state_version=99),
            sdk.VersionMismatch,
            "VERSION_MISMATCH",
        ),
        (lambda cp, t: cp.claim(t, scheduler_epoch=1, ttl_seconds=9999), sdk.Invalid, None),
        (lambda cp, t: cp.claim("no-such-task", scheduler_epoch=1, ttl_seconds=5), sdk.NotFound, None),
    ],
)
def test_each_answer_is_a_distinct_exception(server, op, act, error, reason):
    task_id = op.create().json()["task_id"]
    cp = _sdk(server, make_actor("worker-a", "worker"))

    with pytest.raises(error) as raised:
        act(cp, task_id)

    if reason:
        assert raised.value.reason == reason
    assert Task.objects.get(pk=task_id).claim_generation == 0


def test_a_bad_token_is_unauthenticated(server):
    with pytest.raises(sdk.Unauthenticated):
        sdk.ControlPlane(server, "cp_wrong", owner_id="x").namespace()


def test_the_lease_renews_in_the_background_and_stops_when_fenced(server, op):
    task_id = op.create().json()["task_id"]
    oncall = make_actor("oscar-oncall", "oncall")
    cp = _sdk(server, make_actor("worker-a", "worker"))
    claim = cp.claim(task_id, scheduler_epoch=1, ttl_seconds=2)

    with cp.lease(claim, extend_seconds=2, every=0.3) as lease:
        deadline = time.monotonic() + 10
        while lease.renewals < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lease.renewals >= 3 and lease.remaining() > 1  # held past its first 2-second lease
        oncall.post("/namespaces/default/fence", {"reason": "drill"})
        while lease.lost is None and time.monotonic() < deadline:
            time.sleep(0.05)
        renewed_before = TaskEvent.objects.filter(task_id=task_id, kind="renewed").count()
        time.sleep(1.0)  # would be ~3 more renewals if it kept going
        with pytest.raises(sdk.Fenced):
            lease.check()

    assert lease.lost.reason == "EPOCH" and lease.remaining() == 0
    assert TaskEvent.objects.filter(task_id=task_id, kind="renewed").count() == renewed_before
    assert TaskEvent.objects.filter(task_id=task_id, kind="fenced", point="renew").count() == 1


def test_the_effect_helper_calls_once_and_after_a_takeover_reconciles_instead(
    server, op, effect_target, db_clock
):
    task_id = op.create(node_id="charge").json()["task_id"]
    a = _sdk(server, make_actor("worker-a", "worker"))
    b = _sdk(server, make_actor("worker-b", "worker"))

    def call(key: str):
        reply = httpx.post(
            effect_target.url + "/charge", json={"amount": 10}, headers={"Idempotency-Key": key}, timeout=1
        )
        reply.raise_for_status()
        return reply.json()

    def check(key: str) -> bool:
        return httpx.get(f"{effect_target.url}/calls/{key}").json()["occurred"]

    claim_a = a.claim(task_id, scheduler_epoch=1, ttl_seconds=5)
    effect_target.mode = "drop_reply"
    with pytest.raises(sdk.EffectUnknown) as unknown:
        a.effect(claim_a, "charge", {"amount": 10}, call=call, check=check)
    key = unknown.value.effect_id
    assert Effect.objects.get(pk=key).state == "UNKNOWN"  # a lost reply is never FAILED

    db_clock.travel(6)
    effect_target.mode = "ok"
    claim_b = b.claim(task_id, scheduler_epoch=1, ttl_seconds=30)
    with pytest.raises(sdk.PayloadConflict):
        b.effect(claim_b, "charge", {"amount": 12}, call=call, check=check)
    resolved = b.effect(claim_b, "charge", {"amount": 10}, call=call, check=check)
    again = b.effect(claim_b, "charge", {"amount": 10}, call=call, check=check)

    assert (resolved.state, resolved.called) == ("COMMITTED", False)
    assert (again.state, again.called) == ("COMMITTED", False)
    assert effect_target.count(key) == 1 and effect_target.count() == 1


def test_the_effect_helper_records_a_definite_refusal_as_failed(server, op):
    task_id = op.create().json()["task_id"]
    cp = _sdk(server, make_actor("worker-a", "worker"))
    claim = cp.claim(task_id, scheduler_epoch=1, ttl_seconds=30)

    def refused(key: str):
        raise sdk.EffectFailed("card declined")

    with pytest.raises(sdk.EffectFailed):
        cp.effect(claim, "charge", {"amount": 10}, call=refused)
    done = cp.effect(claim, "charge", {"amount": 10}, call=lambda key: "ok")

    assert (done.state, done.called, done.value) == ("COMMITTED", True, "ok")
    assert [e["kind"] for e in cp.effect_record(done.effect_id)["history"]] == [
        "prepared",
        "outcome",
        "prepared",
        "outcome",
    ]


def test_remaining_counts_down_from_the_grant(server, op):
    task_id = op.create().json()["task_id"]
    cp = _sdk(server, make_actor("worker-a", "worker"))

    claim = cp.claim(task_id, scheduler_epoch=1, ttl_seconds=30)

    assert 28 < claim.remaining() <= 30
    cp.release(claim)
    assert claim.remaining() == 0


def test_the_documented_example_worker_finishes_a_task_with_its_effect_once(server, op, effect_target):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "docs" / "example_worker.py"
    spec = importlib.util.spec_from_file_location("example_worker", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    worker = make_actor("worker-a", "worker")
    task_id = op.create(node_id="summarise", input={"text": "hello"}).json()["task_id"]

    code = example.main(
        [
            "--url",
            server,
            "--token",
            worker.token,
            "--owner",
            "worker-a",
            "--once",
            "--webhook",
            effect_target.url + "/hook",
        ]
    )

    task = Task.objects.get(pk=task_id)
    assert code == 0 and task.state == "COMMITTED"
    assert task.result == {"summary": "{'TEXT': 'HELLO'}"}
    assert effect_target.count() == 1
    assert Effect.objects.get(task_id=task_id).state == "COMMITTED"
