"""The routed worker path stays a pinned number of statements per request, through the API, per stage (the core's
own counts: tests/claims/test_query_counts.py). These are whole requests — authentication, the stage read, the
core's transaction, and where legacy decides its decision, the shadow judgement and the comparison — measured on
PostgreSQL. A change that adds a query must change the number here, on purpose. Before the routing became one
service (issue 11) the same requests took: V1_ONLY claim 8, renew 8, commit 10, release 10, claim-next 8, task
read 2; SHADOW 24, 20, 26, 22, 21, 4; V1_WRITES 17, 16, 18, 18, 15, 2. (The attempt's owner and epoch are one
read now, and a refused registration is part of the namespace read.) After issue 11 and before issue 12's lean path:
V1_ONLY 7, 7, 8, 9, 7, 2; SHADOW 24, 19, 25, 21, 21, 3; V1_WRITES 17, 15, 16, 16, 15, 2. Before issue 22 made every
stage one path (the core's transaction with the stage hook, legacy deciding inside it): SHADOW 29, 19, 25, 22, 25, 2;
V1_WRITES 22, 15, 15, 16, 19, 1."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from rollout.models import ComparedOperation, LegacyClaim
from tests.support.races import index_names

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

PINNED = {
    # stage: claim, renew, commit, release, claim-next, task read. The claim is the token's first request (its
    # lookup: 1); later requests find it remembered (claims/auth.py).
    # V1_ONLY (issue 12; since issue 22 every stage takes this one path): the core's transaction with the stage
    # hook's read under its lock — BEGIN, lock, the hook's read, the writes, COMMIT — nothing read before it.
    "V1_ONLY": (7, 5, 6, 8, 6, 1),
    # One transaction in every stage (issue 22). SHADOW's commit: BEGIN, lock task + namespace, the stage hook's
    # read, flip the staged row, task + attempt + event; then legacy: its row FOR UPDATE with the clock read
    # after the lock (one statement; was two: the row, then the clock), its write, its
    # history; the comparison; claim.v1's view of the task for the answer; COMMIT — 11.
    "SHADOW": (11, 9, 11, 12, 10, 2),
    # a write-through is the legacy row FOR UPDATE with the clock after it, then the write — in the decision's
    # transaction
    "V1_WRITES": (9, 7, 8, 10, 8, 1),
}
# A release makes a task claimable: after its commit, one pg_notify for waiting claims (claims/services/wakeups.py).


def _count(fn):
    with CaptureQueriesContext(connection) as ctx:
        response = fn()
    assert response.status_code in (200, 201, 204), response.content
    return len(ctx.captured_queries), response


@pytest.mark.parametrize("stage", list(PINNED))
def test_the_routed_requests_take_their_pinned_statements(operator, worker_a, stage):
    ns = f"ns-{stage.lower().replace('_', '-')}"
    operator.post("/namespaces", {"name": ns, "stage": stage})
    task = operator.create(namespace=ns).json()["task_id"]
    claimed, response = _count(lambda: worker_a.claim(task))
    claim = response.json()
    renewed, _ = _count(lambda: worker_a.renew(claim))
    worker_a.stage(claim, {"r": 1})
    committed, _ = _count(lambda: worker_a.commit(claim, {"r": 1}))
    other = worker_a.claim(operator.create(namespace=ns).json()["task_id"]).json()
    released, _ = _count(lambda: worker_a.release(other))
    next_claimed, _ = _count(lambda: worker_a.claim_next(namespace=ns))
    read, _ = _count(lambda: worker_a.get(f"/tasks/{task}"))

    assert (claimed, renewed, committed, released, next_claimed, read) == PINNED[stage]


# The worker's own cycle in V1_ONLY (issue 12), token remembered: claim-next, stage, commit of the staged result,
# inline commit, renew; a batch of 10 claims and a batch of 10 inline commits. BEGIN and COMMIT are counted.
WORKER_PATH = {
    "claim-next": 6,  # BEGIN, lock namespace, guard, claim the oldest READY, attempt + event, COMMIT
    "stage": 4,  # BEGIN, attempt + clock, staged row + event, COMMIT (staging is not routed)
    "commit": 6,  # BEGIN, lock task + namespace, guard, flip staged, task + attempt + event, COMMIT
    "inline commit": 6,  # BEGIN, lock, guard, the row staged canonical (one upsert), task + attempt + events, COMMIT
    "renew": 5,  # BEGIN, lock, guard, lease + event, COMMIT
    "batch of 10": 6,  # BEGIN, lock namespace, guard, the 10 picks in one UPDATE, their attempts + events, COMMIT
    "10 commits": 6,  # the inline commit's statements, each once for all 10 (task_commit_many)
}


def test_the_worker_path_in_v1_only_takes_its_pinned_statements(operator, worker_a):
    operator.post("/namespaces", {"name": "ns-worker", "stage": "V1_ONLY"})
    for _ in range(13):
        operator.create(namespace="ns-worker")
    worker_a.get("/tasks")  # the token's lookup, then remembered
    counts = {}

    counts["claim-next"], response = _count(lambda: worker_a.claim_next(namespace="ns-worker"))
    first = response.json()
    counts["stage"], _ = _count(lambda: worker_a.stage(first, {"r": 1}))
    counts["commit"], _ = _count(lambda: worker_a.commit(first, {"r": 1}))
    second = worker_a.claim_next(namespace="ns-worker").json()
    counts["renew"], _ = _count(lambda: worker_a.renew(second))
    counts["inline commit"], _ = _count(lambda: worker_a.commit_inline(second, {"r": 2}))
    counts["batch of 10"], response = _count(lambda: worker_a.claim_batch(10, namespace="ns-worker"))
    claims = response.json()["claims"]
    items = [{"task_id": c["task_id"], **worker_a.commit_body(c, {"r": 3}, inline=True)} for c in claims]
    counts["10 commits"], response = _count(lambda: worker_a.commits(items))

    assert [r["status"] for r in response.json()["results"]] == [200] * 10
    assert counts == WORKER_PATH


# A batch of 10 claims and a batch of 10 inline commits per stage (issue 22): one transaction each, whatever the
# stage — before, outside V1_ONLY, each item was its own routed request (SHADOW: 10 × 25 statements for the commits).
BATCHES = {
    # claims: BEGIN, lock namespace, the stage hook, the picks, attempts + events; then legacy decides the 10 at
    # once (their rows and the clock after their locks in one statement, one INSERT), its history and the
    # comparisons (one statement each); COMMIT. Commits: the same shape around task_commit_many, and one read of
    # the committed tasks for the answers. V1_WRITES: the legacy rows with the clock, one write. Before the rows
    # and the clock were one statement: SHADOW 11 and 12, V1_WRITES 9 and 9; before the store decided several at
    # once: SHADOW 38 and 39, V1_WRITES 36 and 36; before the one path, ten routed requests.
    "V1_ONLY": {"batch of 10": 6, "10 commits": 6},
    "SHADOW": {"batch of 10": 10, "10 commits": 11},
    "V1_WRITES": {"batch of 10": 8, "10 commits": 8},
}


@pytest.mark.parametrize("stage", list(BATCHES))
def test_a_batch_is_one_transaction_in_every_stage(operator, worker_a, stage):
    ns = f"ns-batch-{stage.lower().replace('_', '-')}"
    operator.post("/namespaces", {"name": ns, "stage": stage})
    for _ in range(10):
        operator.create(namespace=ns)
    worker_a.get("/tasks")  # the token's lookup, then remembered
    counts, transactions = {}, {}

    with CaptureQueriesContext(connection) as ctx:
        response = worker_a.claim_batch(10, namespace=ns)
    claims = response.json()["claims"]
    counts["batch of 10"] = len(ctx.captured_queries)
    transactions["batch of 10"] = sum(q["sql"] == "BEGIN" for q in ctx.captured_queries)
    items = [{"task_id": c["task_id"], **worker_a.commit_body(c, {"r": 3}, inline=True)} for c in claims]
    with CaptureQueriesContext(connection) as ctx:
        response = worker_a.commits(items)
    counts["10 commits"] = len(ctx.captured_queries)
    transactions["10 commits"] = sum(q["sql"] == "BEGIN" for q in ctx.captured_queries)

    assert len(claims) == 10
    assert [r["status"] for r in response.json()["results"]] == [200] * 10
    assert transactions == {"batch of 10": 1, "10 commits": 1}
    assert counts == BATCHES[stage]
    legacy = LegacyClaim.objects.filter(namespace=ns)
    if stage == "V1_ONLY":
        assert not legacy.exists()
    else:  # every task completed in the legacy store too, with claim.v1's result
        assert sorted(legacy.values_list("completed_by", flat=True)) == ["worker-a"] * 10
        assert list(legacy.values_list("result", flat=True).distinct()) == [{"r": 3}]
    if stage == "SHADOW":
        assert ComparedOperation.objects.filter(namespace=ns, agreed=True).count() == 20
        assert all(r["body"]["decided_by"] == "legacy" for r in response.json()["results"])


def test_the_legacy_table_carries_only_the_indexes_something_reads():
    """A legacy claim row is written at every legacy decision (SHADOW, V1_READS) and write-through (V1_WRITES):
    the namespace's own index and the LIKE twins of the text keys were entries each time, read by nothing."""
    assert index_names(["rollout_legacyclaim"]) == {
        "rollout_legacyclaim": {"rollout_legacyclaim_pkey", "legacy_incomplete"}
    }
