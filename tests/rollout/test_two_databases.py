"""SHADOW with the legacy table in the team's own database (issue 23, point 3): legacy decides in its database,
claim.v1 judges in ours, and no transaction spans both. Ours commits first — claim.v1's shadow attempt, legacy's
history, the comparison and a LegacyDecision — and theirs second, its rows locked until then; when ours rolls back,
theirs does too. A process killed between the two commits (SIGKILL, a real server) leaves a LegacyDecision without
an outcome: the settle_legacy_decisions job tells from their table that it never happened and releases claim.v1's
attempt for it. The records checked are the rows of both databases."""

from __future__ import annotations

import os
import signal

import httpx
import pytest
from django.db import connections, transaction

from claims import interleave
from claims.digest import digest
from claims.models import Task
from rollout.legacy import LegacyAsk, legacy_unit
from rollout.models import ComparedOperation, LegacyDecision, Mismatch
from rollout.services import legacy_decisions
from rollout.tasks import settle_legacy_decisions
from tests.support.legacy_db import (
    ALIASES,
    NS,
    Their,
    row,
    task_in_both,
    their_table_configured,
    use_their_table,
)
from tests.support.processes import server_process, wait_for
from tests.support.races import Pause, run_in_thread

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", *ALIASES]),
    pytest.mark.skipif(
        not ALIASES, reason="no legacy database configured (the suite's PostgreSQL run adds one)"
    ),
]


def test_their_transaction_rolls_back_with_ours(jobs, their):
    """Legacy decided inside a decision of ours that then failed: their row is as it was, and nothing of it was
    kept in ours. (With their commit made at once — before this change — the grant stayed in their table.)"""
    with legacy_unit(), pytest.raises(RuntimeError):
        with transaction.atomic(durable=True):
            verdicts = jobs.decide_many(
                [
                    LegacyAsk(
                        "claim",
                        {"task_id": "j1", "namespace": "default", "owner_id": "w1", "ttl_seconds": 60},
                    )
                ]
            )
            assert verdicts[0].word == "GRANTED"
            raise RuntimeError("ours fails after legacy decided")

    assert row(their, "j1")[0] is None
    assert not LegacyDecision.objects.exists()


def test_their_commit_follows_ours_and_is_recorded(jobs, their):
    """Until ours commits, nobody else sees legacy's write; then it is there, and our record of it says COMMITTED."""
    onlooker = connections.create_connection(their.alias)
    try:
        with legacy_unit(), transaction.atomic(durable=True):
            jobs.decide_many(
                [
                    LegacyAsk(
                        "claim",
                        {"task_id": "j1", "namespace": "default", "owner_id": "w1", "ttl_seconds": 60},
                    )
                ]
            )
            with onlooker.cursor() as cursor:
                cursor.execute("SELECT locked_by FROM jobs WHERE job_id = 'j1'")
                seen_before_ours = cursor.fetchone()[0]
    finally:
        onlooker.close()

    assert seen_before_ours is None

    decision = LegacyDecision.objects.get()
    assert (decision.operation, decision.owner_id, decision.outcome) == ("claim", "w1", "COMMITTED")
    assert decision.found["owner_id"] == "" and decision.expected["owner_id"] == "w1"
    assert row(their, "j1")[0] == "w1"


@pytest.mark.skipif(
    "legacy" not in connections, reason="the server process's legacy alias is the PostgreSQL one"
)
@pytest.mark.parametrize("their_side", ["aborted", "committed"])
def test_a_server_killed_between_our_commit_and_theirs_leaves_both_databases_agreeing(
    operator, worker_a, settings, their_side
):
    """A claim.v1 worker claims in SHADOW through a real server. Our transaction commits (claim.v1's shadow
    attempt, the comparison, the LegacyDecision); their COMMIT then waits — a deferred trigger the test put on their
    table takes an advisory lock the test holds — and the server is killed (SIGKILL) right there. Then either their
    database ends the dead client's session (``aborted``: as it does once it notices the client is gone), or the
    COMMIT it was already running goes through (``committed``: PostgreSQL does not look at the client while it waits
    on a lock). The job finds the decision open and asks their table: aborted — claim.v1's attempt for a grant that
    never happened is released; committed — it stands, nothing undone."""
    their = Their("legacy")
    their.create_jobs()
    their.sql("DROP FUNCTION IF EXISTS hold_commit() CASCADE")  # left by an earlier run that failed
    their.sql(
        "CREATE FUNCTION hold_commit() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN PERFORM pg_advisory_xact_lock(4223); RETURN NULL; END $$"
    )
    their.sql(
        "CREATE CONSTRAINT TRIGGER hold_commit AFTER UPDATE ON jobs DEFERRABLE INITIALLY DEFERRED "
        "FOR EACH ROW EXECUTE FUNCTION hold_commit()"
    )
    assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201
    task_id = task_in_both(operator, their)
    holder = connections.create_connection("legacy")
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(4223)")
        with server_process(**use_their_table("legacy")) as (url, proc):
            body = {"owner_id": "worker-a", "scheduler_epoch": 1, "ttl_seconds": 30}
            thread, box = run_in_thread(
                lambda: httpx.post(
                    f"{url}/api/v1/tasks/{task_id}/claim",
                    json=body,
                    headers={"Authorization": f"Bearer {worker_a.token}"},
                    timeout=30,
                )
            )
            assert wait_for(lambda: their.lock_waiters() >= 1)  # ours committed; their COMMIT waits
            assert LegacyDecision.objects.filter(task_id=task_id, resolved_at__isnull=True).exists()
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
            thread.join(30)
        if their_side == "aborted":
            their.sql(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )
        holder.rollback()
    finally:
        holder.close()

    try:
        assert "error" in box  # no answer: the server died mid-request
        assert wait_for(lambda: their.lock_waiters() == 0)
        if their_side == "committed":  # granted the lock, the dead client's COMMIT finishes a moment later
            assert wait_for(lambda: row(their, task_id)[0] == "worker-a")
        else:
            assert row(their, task_id)[0] is None
        task = Task.objects.get(pk=task_id)
        assert (task.state, task.owner_id) == ("CLAIMED", "worker-a")  # claim.v1's shadow attempt committed
        assert ComparedOperation.objects.filter(namespace=NS, operation="claim").count() == 1
        settings.LEGACY_DECISION_GRACE_SECONDS = 0
        with their_table_configured("legacy"):
            settled = settle_legacy_decisions.delay().get()
            assert legacy_decisions.resolve_open() == {"committed": 0, "aborted": 0}  # nothing left open
    finally:
        their.sql("DROP TABLE IF EXISTS jobs")
        their.sql("DROP FUNCTION IF EXISTS hold_commit()")

    decision = LegacyDecision.objects.get(task_id=task_id)
    task = Task.objects.get(pk=task_id)
    if their_side == "aborted":
        assert settled == {"committed": 0, "aborted": 1}
        assert decision.outcome == "ABORTED" and decision.undone.startswith("released claim.v1 attempt")
        assert (task.state, task.owner_id) == ("READY", None)
    else:
        assert settled == {"committed": 1, "aborted": 0}
        assert (decision.outcome, decision.undone) == ("COMMITTED", "")
        assert (task.state, task.owner_id) == ("CLAIMED", "worker-a")


def test_an_open_decision_their_table_did_commit_is_told_committed(jobs, their, settings):
    """The process died after their commit and before ours marked it: the row is as the decision wrote it."""
    with legacy_unit(), transaction.atomic(durable=True):
        jobs.decide_many(
            [
                LegacyAsk(
                    "claim", {"task_id": "j2", "namespace": "default", "owner_id": "w1", "ttl_seconds": 60}
                )
            ]
        )
    LegacyDecision.objects.update(resolved_at=None, outcome="")  # as if the mark never came
    settings.LEGACY_DECISION_GRACE_SECONDS = 0
    with their_table_configured(their.alias):
        assert legacy_decisions.resolve_open() == {"committed": 1, "aborted": 0}
    assert LegacyDecision.objects.get().outcome == "COMMITTED"
    assert row(their, "j2")[0] == "w1"


def test_a_legacy_api_request_killed_after_legacy_decided_leaves_both_stores_as_they_were(
    table_store, operator
):
    """An old binary claims through the legacy API in SHADOW: claim.v1 judges it, and legacy decides inside that
    judgement's transaction. The process dies right after legacy decided: nothing of it is kept in either database —
    no claim.v1 attempt, no history, no comparison, their row untouched. (When claim.v1 judged after legacy's
    commit, in transactions of its own, such a death left a legacy decision uncompared.)"""
    from claims import interleave
    from tests.support.actors import make_actor

    their = table_store
    assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201
    task_id = task_in_both(operator, their)
    old = make_actor("old-binary", "worker")

    def die() -> None:
        raise SystemExit("killed after legacy decided")

    interleave.install("legacy_operation.decided", die)
    try:
        with pytest.raises(SystemExit):
            old.client.post(
                f"/api/legacy/tasks/{task_id}/claim",
                {"owner_id": "old-binary", "ttl_seconds": 30},
                format="json",
            )
    finally:
        interleave.clear()

    assert row(their, task_id)[0] is None
    assert Task.objects.get(pk=task_id).owner_id is None
    assert not ComparedOperation.objects.filter(namespace=NS).exists()
    assert not LegacyDecision.objects.exists()


def test_a_claim_legacy_decided_before_shadow_and_committed_after_the_advance_is_imported(
    table_store, operator
):
    """An old binary claims through the legacy API in LEGACY; ours commits (the namespace's lock let go) and theirs
    is about to. The advance to SHADOW lands right there and imports the live legacy claims: it waits for that
    commit and imports the claim, so the owner's complete in SHADOW agrees. (Before, the import read their table
    without the uncommitted claim, claim.v1 had no attempt for the owner, and the complete was reported a
    STALE_COMMIT_ACCEPTED — a false mismatch the migration drill met about one run in ten.)"""
    from tests.support.actors import make_actor

    their = table_store
    assert operator.post("/namespaces", {"name": NS, "stage": "LEGACY"}).status_code == 201
    task_id = task_in_both(operator, their)
    old, oncall = make_actor("old-binary", "worker"), make_actor("oscar-oncall", "oncall")
    between = Pause("legacy_table.ours_committed")
    try:
        claimer, claimed = run_in_thread(
            lambda: old.client.post(
                f"/api/legacy/tasks/{task_id}/claim",
                {"owner_id": "old-binary", "ttl_seconds": 60},
                format="json",
            )
        )
        between.wait_reached()
        assert row(their, task_id)[0] is None  # their commit has not happened
        advancer, advanced = run_in_thread(
            lambda: oncall.post(
                f"/namespaces/{NS}/rollout/advance",
                {"to_stage": "SHADOW", "reason": "test", "override": True},
            )
        )
        wait_for(lambda: their.lock_waiters() >= 1 or not advancer.is_alive(), seconds=10)
    finally:
        between.resume()
        interleave.clear()
    claimer.join(30), advancer.join(60)
    assert claimed["value"].status_code == 200 and advanced["value"].status_code == 200, advanced

    task = Task.objects.get(pk=task_id)
    assert (task.state, task.owner_id) == ("CLAIMED", "old-binary")  # imported
    done = old.client.post(
        f"/api/legacy/tasks/{task_id}/complete",
        {"owner_id": "old-binary", "result": {"r": 1}, "result_digest": digest({"r": 1})},
        format="json",
    )
    assert done.status_code == 200, done.json()
    assert not Mismatch.objects.filter(task_id=task_id).exists(), list(
        Mismatch.objects.values("reason", "v1")
    )
    assert Task.objects.get(pk=task_id).state == "COMMITTED"
