"""Issue 39, 2 — trace validation: a recorded history replayed against the Spin model of the claim rules
(model/trace.pml, tests/support/trace.py). A history the service really made is explained event by event; a wrong
event injected into it — a grant while a lease was live, a commit on an old generation — is rejected, at that event.
The chaos runs replay their own histories the same way (tests/chaos/test_history.py, tests/ha/)."""

from __future__ import annotations

import shutil

import pytest
from django.db import connection

from tests.support import trace

pytestmark = pytest.mark.skipif(
    shutil.which("spin") is None, reason="needs Debian's spin (.ci/run installs it)"
)


def _query(sql: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


@pytest.fixture
def history(worker_a, worker_b, operator, oncall, db_clock):
    """Grants, a renew, a reclaim after a lease ran out, a release, a fence with the claims after it, commits."""
    first, second, third = (operator.create(node_id="n").json()["task_id"] for _ in range(3))
    a = worker_a.claim(first, ttl=5).json()
    worker_a.renew(a)
    db_clock.travel(31)  # a's lease (renewed: 30 s) runs out
    b = worker_b.claim(first).json()
    assert b["claim_generation"] == 2
    worker_b.stage(b, {"v": "b"})
    assert worker_b.commit(b, {"v": "b"}).status_code == 200
    c = worker_a.claim(second).json()
    worker_a.release(c)
    oncall.post("/namespaces/default/fence", {"reason": "drill"})
    oncall.post("/namespaces/default/resume", {})
    d = worker_a.claim(third, epoch=2).json()
    worker_a.stage(d, {"v": "d"})
    assert worker_a.commit(d, {"v": "d"}).status_code == 200
    return trace.recorded(_query)


def test_a_history_the_service_made_is_explained(history):
    verdict = trace.replay(history)

    assert verdict.explained, verdict
    assert verdict.events == len(history) >= 10
    assert {e.kind for e in history} >= {
        "claimed",
        "reclaimed",
        "renewed",
        "released",
        "result_committed",
        "fence",
    }


@pytest.mark.parametrize("inject", [trace.a_grant_inside_a_live_lease, trace.a_commit_on_an_old_generation])
def test_a_wrong_event_injected_is_rejected_at_that_event(history, inject):
    wrong = inject(history)
    added = next(i for i, (x, y) in enumerate(zip(wrong, [*history, None], strict=False)) if x != y)

    verdict = trace.replay(wrong)

    assert verdict.rejected == added, (verdict, wrong[added].line())
