"""Priority and fair share at their read→write windows (claim-v1.md §10), over separate PostgreSQL connections: each
test holds what one party holds — a lane's lock mid-create, a stale claim another claimer is taking back — and
reads the task rows afterwards."""

from __future__ import annotations

import pytest

from claims.models import Task
from tests.support.actors import make_actor
from tests.support.races import Pause, row_locked, run_in_thread, wait_done_or_waiting

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_two_creates_in_one_lane_never_get_one_place(operator):
    """The lane's last place is read under the lock its update takes: a create that stamped and still holds the
    lane makes the next create of the lane wait, then stamp after it."""
    operator.create(task_id="first", fairness_key="tenant")
    pause = Pause("fair_share.stamped")
    creating, first_box = run_in_thread(lambda: operator.create(task_id="second", fairness_key="tenant"))
    pause.wait_reached()  # "second" is stamped; its transaction holds the lane
    other = make_actor("other-operator", "operator")
    racing, second_box = run_in_thread(lambda: other.create(task_id="third", fairness_key="tenant"))
    wait_done_or_waiting(second_box, 1)
    pause.resume()
    creating.join(30)
    racing.join(30)

    assert first_box["value"].status_code == second_box["value"].status_code == 201
    places = dict(Task.objects.filter(fairness_key="tenant").values_list("task_id", "vtag"))
    assert places["first"] < places["second"] < places["third"], places


def test_a_stale_claim_being_taken_back_elsewhere_never_leaves_a_claim_with_nothing(operator, db_clock):
    """A better-priority stale claim bounds the READY pick only when this request could take it back: one another
    claimer is deciding on (its row locked) does not keep this request from the READY task it may take."""
    operator.create(task_id="ready-p3")
    operator.create(task_id="stale-p1", priority=1)
    make_actor("gone", "worker").claim("stale-p1", ttl=5)
    db_clock.travel(6)
    worker = make_actor("worker-x", "worker")
    with row_locked("SELECT 1 FROM claims_task WHERE task_id = %s FOR NO KEY UPDATE", ["stale-p1"]):
        response = worker.claim_next()
    assert response.status_code == 200, response.status_code
    assert response.json()["task_id"] == "ready-p3"
    assert Task.objects.get(pk="ready-p3").owner_id == "worker-x"
    assert Task.objects.get(pk="stale-p1").owner_id == "gone"
