"""V1_WRITES with the legacy table in the team's own database (issue 23, point 3): every claim.v1 decision's
write-through is recorded in our database in the decision's transaction, applied to their table after our commit,
and retried by the apply_legacy_writes job until applied — across a legacy database that refuses it, a server killed
(SIGKILL) between the two commits, and a crash after theirs and before ours marked it. The records checked are the
rows of both databases."""

from __future__ import annotations

import os
import signal

import httpx
import pytest
from django.db import connections
from prometheus_client import REGISTRY

from claims import interleave
from claims.models import Attempt, Task
from rollout.models import LegacyWrite
from rollout.services import stages, write_through
from rollout.tasks import apply_legacy_writes
from tests.support.legacy_db import (
    ALIASES,
    NS,
    Their,
    aware,
    row,
    task_in_both,
    use_their_table,
    wait_for_a_lock_waiter,
)
from tests.support.processes import server_process, wait_for
from tests.support.races import run_in_thread

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", *ALIASES]),
    pytest.mark.skipif(
        not ALIASES, reason="no legacy database configured (the suite's PostgreSQL run adds one)"
    ),
]


def _at_v1_writes(operator, namespace: str = NS) -> None:
    assert operator.post("/namespaces", {"name": namespace, "stage": "V1_WRITES"}).status_code == 201


def test_each_decision_is_recorded_with_it_and_written_to_their_table_after_our_commit(
    table_store, operator, worker_a
):
    their = table_store
    _at_v1_writes(operator)
    task_id = task_in_both(operator, their)

    claim = worker_a.claim(task_id).json()
    assert claim["attempt_id"], claim
    owner, until, _, _, payload = row(their, task_id)
    assert (owner, until, payload) == ("worker-a", aware(Task.objects.get(pk=task_id).lease_expires_at), "p")

    committed = worker_a.post(f"/tasks/{task_id}/commit", worker_a.commit_body(claim, {"r": 1}, inline=True))
    assert committed.status_code == 200, committed.json()
    assert row(their, task_id)[2:4] == ({"r": 1}, "worker-a")
    writes = list(LegacyWrite.objects.order_by("id").values_list("kind", "outcome", "tries"))
    assert writes == [("record", "RECORDED", 0), ("complete", "COMPLETED", 0)]
    assert not LegacyWrite.objects.filter(applied_at__isnull=True).exists()


def test_a_write_their_database_refuses_waits_counted_in_the_drain_and_the_metric_until_the_job_applies_it(
    table_store, operator, worker_a
):
    their = table_store
    _at_v1_writes(operator)
    task_id = task_in_both(operator, their)
    their.sql("ALTER TABLE jobs RENAME TO jobs_away")  # their database refuses every statement on the table

    claim = worker_a.claim(task_id)

    assert claim.status_code == 200, (
        claim.json()
    )  # claim.v1 decided; the write-through waits, it is not dropped
    pending = LegacyWrite.objects.get()
    assert (pending.applied_at, pending.tries) == (None, 1) and "jobs" in pending.error
    assert REGISTRY.get_sample_value("rollout_legacy_writes_pending", {"namespace": NS}) == 1
    assert apply_legacy_writes.delay().get()["failed"] == 1  # still away: retried, kept
    assert LegacyWrite.objects.get().tries == 2

    their.sql("ALTER TABLE jobs_away RENAME TO jobs")
    snapshot = stages.drain_snapshot(namespace=NS)  # (the drain reads their table's live claims too)
    assert (snapshot.legacy_writes_pending, snapshot.is_clean) == (1, False)
    done = apply_legacy_writes.delay().get()

    assert (done["applied"], done["failed"]) == (1, 0)
    assert row(their, task_id)[0] == "worker-a"
    assert LegacyWrite.objects.get().outcome == "RECORDED"
    assert stages.drain_snapshot(namespace=NS).legacy_writes_pending == 0
    assert REGISTRY.get_sample_value("rollout_legacy_writes_pending", {"namespace": NS}) is None


def test_a_crash_after_their_commit_and_before_ours_applies_the_write_again_to_the_same_row(
    table_store, operator, worker_a
):
    """The applier dies after their transaction committed and before ours marked the rows: ours rolls back, the
    rows stay pending, and the next run applies them again — their row ends as one application left it."""
    their = table_store
    _at_v1_writes(operator)
    task_id = task_in_both(operator, their)

    def die() -> None:
        raise SystemExit("killed between the two commits")

    interleave.install("write_through.applied", die)
    try:
        with pytest.raises(SystemExit):
            worker_a.claim(task_id)
    finally:
        interleave.clear()

    assert row(their, task_id)[0] == "worker-a"  # theirs committed
    assert LegacyWrite.objects.get().applied_at is None  # ours did not: pending
    assert Attempt.objects.filter(task_id=task_id).count() == 1  # the decision itself committed before either
    expiry = row(their, task_id)[1]

    assert write_through.apply_pending().applied == 1
    assert row(their, task_id)[:2] == ("worker-a", expiry)
    assert LegacyWrite.objects.get().applied_at is not None


def test_two_writes_of_one_task_land_in_the_order_they_were_decided(table_store, operator, worker_a):
    """Both pending (their database refused both), then applied by one run: the release after the claim, never
    the claim over the release."""
    their = table_store
    _at_v1_writes(operator)
    task_id = task_in_both(operator, their)
    their.sql("ALTER TABLE jobs RENAME TO jobs_away")
    claim = worker_a.claim(task_id).json()
    released = worker_a.release(claim)
    assert released.status_code == 200, released.json()
    their.sql("ALTER TABLE jobs_away RENAME TO jobs")

    assert write_through.apply_pending().applied == 2

    assert row(their, task_id)[:2] == (None, None)
    assert [w.fields["owner_id"] for w in LegacyWrite.objects.order_by("id")] == ["worker-a", ""]


@pytest.mark.skipif(
    "legacy" not in connections, reason="the server process's legacy alias is the PostgreSQL one"
)
def test_a_server_killed_between_the_two_commits_loses_no_write_through(operator, worker_a, celery_workers):
    """A real server (its own process) answers a claim in V1_WRITES; our transaction commits, and the
    write-through to their table waits on a row this test holds locked there. The server is killed (SIGKILL)
    right there. Afterwards: our database has the attempt and its pending write; theirs has nothing of it. The job
    applies it (a real Celery worker); both agree."""
    their = Their("legacy")
    their.create_jobs()
    _at_v1_writes(operator)
    task_id = task_in_both(operator, their)
    env = {**use_their_table("legacy"), "LEGACY_LOCK_TIMEOUT_SECONDS": "60"}
    holder = connections.create_connection("legacy")
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute("SELECT 1 FROM jobs WHERE job_id = %s FOR UPDATE", [task_id])
        with server_process(**env) as (url, proc):
            body = {"owner_id": "worker-a", "scheduler_epoch": 1, "ttl_seconds": 30}
            thread, box = run_in_thread(
                lambda: httpx.post(
                    f"{url}/api/v1/tasks/{task_id}/claim",
                    json=body,
                    headers={"Authorization": f"Bearer {worker_a.token}"},
                    timeout=30,
                )
            )
            wait_for_a_lock_waiter(their)  # our commit is done; the write-through waits on their row
            assert Attempt.objects.filter(task_id=task_id).count() == 1
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            thread.join(30)
        holder.rollback()
    finally:
        holder.close()

    assert "error" in box  # the worker got no answer: the server died mid-request
    attempt = Attempt.objects.get(task_id=task_id)
    assert attempt.owner_id == "worker-a"
    write = LegacyWrite.objects.get()
    assert write.applied_at is None and write.fields["owner_id"] == "worker-a"
    assert row(their, task_id)[:2] == (None, None)

    try:
        celery_workers.start(**env)  # the job, through a real worker on the real broker
        apply_legacy_writes.delay()
        assert wait_for(lambda: LegacyWrite.objects.get().applied_at is not None), celery_workers.log()
        owner, until, *_ = row(their, task_id)
    finally:
        their.sql("DROP TABLE IF EXISTS jobs")

    assert (owner, until) == ("worker-a", aware(Task.objects.get(pk=task_id).lease_expires_at))
    assert LegacyWrite.objects.get().applied_at is not None


def test_a_task_their_table_does_not_have_is_refused_with_a_word_of_the_contract(table_store, operator):
    """Where legacy decides (SHADOW), a task with no row in their table: the store says MISSING; the wire says
    NOT_OWNER (the contract's words are HELD and NOT_OWNER), naming no owner; nothing is written in their table."""
    from tests.support.actors import make_actor

    their = table_store
    assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201
    task_id = operator.create(namespace=NS).json()["task_id"]  # not in their table
    old = make_actor("old-binary", "worker")

    refused = old.client.post(
        f"/api/legacy/tasks/{task_id}/claim", {"owner_id": "old-binary", "ttl_seconds": 30}, format="json"
    )

    assert refused.status_code == 409, refused.json()
    assert (refused.json()["outcome"], refused.json()["owner_id"]) == ("NOT_OWNER", ""), refused.json()
    assert their.sql("SELECT count(*) FROM jobs")[0][0] == 3


def test_a_claim_next_that_finds_nothing_writes_nothing_through(table_store, operator, worker_a):
    """V1_WRITES with their table: claim-next on an empty namespace answers 'nothing' (found by the drill: the
    empty write-through raised)."""
    _at_v1_writes(operator)

    nothing = worker_a.claim_next(namespace=NS)

    assert nothing.status_code == 204  # nothing to claim (claim-v1.md)
    assert not LegacyWrite.objects.exists()
