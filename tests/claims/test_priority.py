"""Priority and fair share (claim-v1.md §10): the grant order of claim-next and batch claims, the operator's priority
change, and the fair-share bound of docs/architecture.md ("Priority and fair share") — checked on the task rows the
claims took, in the order they were granted."""

from __future__ import annotations

from collections import Counter
from itertools import accumulate

import pytest

from claims.models import AuditEntry, Task, TaskEvent
from tests.support.actors import make_actor
from tests.support.backlog import backlog

pytestmark = pytest.mark.django_db


def granted(worker, count: int, batch: int = 100) -> list[dict]:
    """The next ``count`` grants in the order the server granted them (batches answer in grant order)."""
    grants: list[dict] = []
    while len(grants) < count:
        response = worker.claim_batch(min(batch, count - len(grants)))
        assert response.status_code == 200, response.content
        grants += response.json()["claims"]
    return grants


def keys_of(grants: list[dict]) -> list[str]:
    by_id = dict(
        Task.objects.filter(pk__in=[g["task_id"] for g in grants]).values_list("task_id", "fairness_key")
    )
    return [by_id[g["task_id"]] for g in grants]


def worst_window(keys: list[str], weights: dict[str, float]) -> float:
    """The largest excess, over every window of consecutive grants, of |grants_f / w_f − grants_g / w_g| over the
    bound 1/w_f + 1/w_g (≤ 0 holds the bound). Every key must have had claimable tasks throughout ``keys``."""
    names = sorted(weights)
    normalised = {k: list(accumulate((1 / weights[k] if key == k else 0.0) for key in keys)) for k in names}
    worst = float("-inf")
    for f in names:
        for g in names:
            if f >= g:
                continue
            bound = 1 / weights[f] + 1 / weights[g]
            diffs = [0.0] + [a - b for a, b in zip(normalised[f], normalised[g], strict=True)]
            worst = max(worst, max(diffs) - min(diffs) - bound)  # the widest swing over any window
    return worst


def test_a_client_that_sends_none_of_it_sees_oldest_first(operator, worker_a):
    ids = [operator.create(task_id=f"t-{n}").json()["task_id"] for n in (3, 1, 2, 5, 4)]
    grants = [worker_a.claim_next().json()["task_id"] for _ in ids]
    assert grants == ids
    assert set(Task.objects.values_list("priority", "fairness_key", "fairness_weight")) == {(3, "", 1.0)}


def test_the_smallest_priority_first_then_oldest(operator, worker_a):
    operator.create(task_id="p3-old", priority=3)
    operator.create(task_id="p5", priority=5)
    operator.create(task_id="p1", priority=1)
    operator.create(task_id="p3-new")
    grants = granted(worker_a, 4, batch=2)
    assert [g["task_id"] for g in grants] == ["p1", "p3-old", "p3-new", "p5"]


def test_a_priority_one_task_behind_a_large_backlog_is_the_next_grant(operator, worker_a):
    backlog(100_000)
    urgent = operator.create(task_id="urgent", priority=1).json()
    assert (urgent["priority"], urgent["state"]) == (1, "READY")
    assert worker_a.claim_next().json()["task_id"] == "urgent"
    assert Task.objects.get(pk="urgent").owner_id == worker_a.name


def test_weights_share_the_grants_from_the_first_one(operator, worker_a):
    """Two keys, weights 3 and 1, backlogs of 100,000 and 100 (the large one created first): the small key's tasks
    are granted at its share — one in four — from the first grant, within the bound on every window."""
    backlog(100_000, key="big", weight=3)
    for n in range(100):
        assert operator.create(task_id=f"small-{n:03d}", fairness_key="small").status_code == 201
    grants = granted(worker_a, 400)
    keys = keys_of(grants)
    assert abs(Counter(keys)["small"] - 100) <= 1  # its share, 1/4 of 400, within the bound
    assert worst_window(keys, {"big": 3, "small": 1}) <= 1e-9
    assert keys.index("small") <= 4  # its first task is among the first grants
    smalls = [g["task_id"] for g in grants if g["task_id"].startswith("small-")]
    assert smalls == sorted(smalls)  # within a key, oldest first


def test_a_key_that_arrives_later_gets_its_share_at_once(operator, worker_a):
    backlog(5_000, key="big", weight=3)
    before = keys_of(granted(worker_a, 200))
    assert set(before) == {"big"}
    for n in range(50):
        operator.create(task_id=f"late-{n:02d}", fairness_key="late")
    keys = keys_of(granted(worker_a, 200))
    assert abs(Counter(keys)["late"] - 50) <= 1
    assert worst_window(keys, {"big": 3, "late": 1}) <= 1e-9


def test_ten_keys_of_equal_weight_get_equal_shares(worker_a):
    for k in range(10):
        backlog(300, key=f"k{k}")  # each key's backlog created after the last one's
    keys = keys_of(granted(worker_a, 1000))
    assert all(abs(count - 100) <= 1 for count in Counter(keys).values()), Counter(keys)
    assert worst_window(keys, {f"k{k}": 1 for k in range(10)}) <= 1e-9


def test_a_key_that_went_idle_gets_no_burst_when_it_returns(operator, worker_a):
    backlog(3_000, key="steady")
    for n in range(5):
        operator.create(task_id=f"early-{n}", fairness_key="returning")
    first = keys_of(granted(worker_a, 10))
    assert abs(Counter(first)["returning"] - 5) <= 1
    granted(worker_a, 1000)  # "returning" has nothing: "steady" alone, for a long while
    for n in range(500):
        operator.create(task_id=f"back-{n:03d}", fairness_key="returning")
    keys = keys_of(granted(worker_a, 400))
    assert abs(Counter(keys)["returning"] - 200) <= 1
    assert worst_window(keys, {"steady": 1, "returning": 1}) <= 1e-9


def test_a_weight_given_later_stands_for_the_tasks_placed_after_it(operator, worker_a):
    operator.create(task_id="a-0", fairness_key="a", fairness_weight=2)
    answer = operator.create(task_id="a-1", fairness_key="a").json()
    assert answer["fairness_weight"] == 2.0  # the key's weight: the latest one given
    operator.create(task_id="a-2", fairness_key="a", fairness_weight=0.5)
    assert Task.objects.get(pk="a-2").fairness_weight == 0.5


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"priority": 0}, "priority"),
        ({"priority": 6}, "priority"),
        ({"priority": "1"}, "priority"),
        ({"priority": True}, "priority"),
        ({"fairness_key": "k" * 65}, "fairness_key"),
        ({"fairness_key": 7}, "fairness_key"),
        ({"fairness_weight": 0}, "fairness_weight"),
        ({"fairness_weight": 1000.5}, "fairness_weight"),
        ({"fairness_weight": "2"}, "fairness_weight"),
        ({"fairness_weight": None}, "fairness_weight"),
    ],
)
def test_out_of_range_is_a_400_with_the_field_and_nothing_written(operator, fields, field):
    response = operator.create(task_id="bad", **fields)
    assert response.status_code == 400, response.content
    assert (response.json()["outcome"], list(response.json()["errors"])) == ("INVALID", [field])
    assert not Task.objects.filter(pk="bad").exists()


def test_a_repeat_with_another_key_is_task_exists_and_another_priority_a_repeat(operator):
    operator.create(task_id="t", fairness_key="a", priority=2)
    assert operator.create(task_id="t", fairness_key="a", priority=4).status_code == 200
    assert Task.objects.get(pk="t").priority == 2
    response = operator.create(task_id="t", fairness_key="b", priority=2)
    assert (response.status_code, response.json()["outcome"]) == (409, "TASK_EXISTS")


# --- the operator's priority change -------------------------------------------------------------------------------


def test_an_operator_moves_a_waiting_task_to_the_front(operator, worker_a):
    backlog(1_000)
    operator.create(task_id="late")
    response = operator.post("/tasks/late/priority", {"priority": 1, "reason": "incident #7"})
    assert response.status_code == 200, response.content
    assert response.json()["priority"] == 1
    assert worker_a.claim_next().json()["task_id"] == "late"
    event = TaskEvent.objects.get(task_id="late", kind="priority_changed")
    assert (event.principal, event.detail) == (operator.name, {"from": 3, "to": 1, "reason": "incident #7"})
    audit = AuditEntry.objects.get(action="task_set_priority")
    assert (audit.principal, audit.target, audit.reason) == (operator.name, "late", "incident #7")


def test_a_priority_change_never_interrupts_the_holder(operator, worker_a):
    task_id = operator.create().json()["task_id"]
    claim = worker_a.claim(task_id).json()
    assert operator.post(f"/tasks/{task_id}/priority", {"priority": 5, "reason": "later"}).status_code == 200
    assert worker_a.renew(claim).status_code == 200
    assert worker_a.finish(claim, {"ok": True}).status_code == 200
    task = Task.objects.get(pk=task_id)
    assert (task.state, task.priority, task.claim_generation) == ("COMMITTED", 5, 1)


def test_a_finished_task_is_not_claimable_and_unchanged(operator, worker_a):
    task_id = operator.create().json()["task_id"]
    worker_a.finish(worker_a.claim(task_id).json(), {"ok": True})
    response = operator.post(f"/tasks/{task_id}/priority", {"priority": 1, "reason": "too late"})
    assert (response.status_code, response.json()["outcome"], response.json()["reason"]) == (
        409,
        "NOT_CLAIMABLE",
        "STATE",
    )
    assert Task.objects.get(pk=task_id).priority == 3
    assert not AuditEntry.objects.filter(action="task_set_priority").exists()


def test_a_worker_may_not_change_a_priority(operator, worker_a):
    task_id = operator.create().json()["task_id"]
    assert (
        worker_a.post(f"/tasks/{task_id}/priority", {"priority": 1, "reason": "me first"}).status_code == 403
    )
    assert Task.objects.get(pk=task_id).priority == 3


# --- READY tasks and claims to take back, in one order ------------------------------------------------------------


def test_an_expired_claim_of_a_better_priority_is_taken_back_before_a_ready_task(
    operator, worker_a, db_clock
):
    operator.create(task_id="ready-p3")
    operator.create(task_id="held-p1", priority=1)
    make_actor("gone", "worker").claim("held-p1", ttl=5)
    db_clock.travel(6)
    grant = worker_a.claim_next().json()
    assert (grant["task_id"], grant["claim_generation"]) == ("held-p1", 2)


def test_a_ready_task_of_a_better_priority_goes_before_an_expired_claim(operator, worker_a, db_clock):
    operator.create(task_id="held-p3")
    make_actor("gone", "worker").claim("held-p3", ttl=5)
    operator.create(task_id="ready-p2", priority=2)
    db_clock.travel(6)
    grants = granted(worker_a, 2, batch=2)
    assert [g["task_id"] for g in grants] == ["ready-p2", "held-p3"]


def test_a_stale_claim_that_may_not_be_taken_back_never_holds_off_a_ready_task(operator, worker_a, db_clock):
    """A stale priority-1 claim whose resource key another task's live attempt holds is passed over — and then no
    longer bounds the READY pick: the READY priority-3 task is granted, not a 204."""
    assert operator.post("/resources", {"resource_key": "repo"}).status_code == 201
    operator.create(task_id="stale-p1", priority=1, resources=["repo"])
    make_actor("gone", "worker").claim("stale-p1", ttl=5)
    db_clock.travel(6)  # its lease ran out: the key is free, and another task takes it
    operator.create(task_id="holder-p5", priority=5, resources=["repo"])
    assert make_actor("holder", "worker").claim("holder-p5", ttl=300).status_code == 200
    operator.create(task_id="ready-p3")

    response = worker_a.claim_next()

    assert response.status_code == 200, response.status_code
    assert response.json()["task_id"] == "ready-p3"
    assert Task.objects.get(pk="stale-p1").owner_id == "gone"
    assert Task.objects.get(pk="ready-p3").owner_id == worker_a.name
