"""Observe mode on MySQL/MariaDB through the binary log (issue 34, point 2): the team's workers write their own table
by plain SQL; the control plane reads the server's row-based log as a replica of its own and judges every change, in
commit order, on the row's own updated-at clock — a claim, release and second claim between two polls are three
decisions here (the polling observer sees one). Its position is crash-safe: a killed observer resumes judging no
change twice and skipping none, across a rotation of the log too. On a MariaDB with its log on
(scripts/legacy-mariadb-binlog.sh, the ``legacy_binlog`` alias)."""

from __future__ import annotations

import time

import pytest
from django.db import connections

from claims import interleave
from claims.models import Task
from examples.legacy_jobs.app import SCHEMA
from rollout.models import ComparedOperation, LegacyEvent, Mismatch, ObserverPosition
from rollout.services import observers
from tests.support.legacy_db import (
    NS,
    Their,
    mysql_claim,
    mysql_complete,
    mysql_release,
    task_in_both,
    their_table_configured,
)

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "legacy_binlog"]),
    pytest.mark.skipif(
        "legacy_binlog" not in connections,
        reason="no MariaDB with its binary log on (LEGACY_BINLOG_URL; .ci/run sets it)",
    ),
]


@pytest.fixture
def their():
    db = Their("legacy_binlog")
    db.sql("DROP TABLE IF EXISTS jobs")
    db.sql(SCHEMA["mysql"])
    with their_table_configured("legacy_binlog", changed="changed_at"):
        yield db
    db.sql("DROP TABLE IF EXISTS jobs")


claim, release, complete = mysql_claim, mysql_release, mysql_complete


def test_every_change_is_judged_in_commit_order_and_the_stale_overwrite_is_caught(their, operator):
    assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201
    job, other = task_in_both(operator, their), task_in_both(operator, their)
    assert observers.method() == "binlog"
    observers.setup()

    assert claim(their, other, "w3", ttl=30)
    release(their, other, "w3")  # between two reads of a poller: claim, release, claim — three decisions here
    assert claim(their, other, "w4", ttl=30)
    assert claim(their, job, "w1", ttl=1)
    time.sleep(1.2)  # w1's claim runs out in their table
    assert claim(their, job, "w2", ttl=30)
    complete(their, job, "w1", {"by": "w1"})  # the stale overwrite (A16)
    complete(their, job, "w2", {"by": "w2"})

    counts = observers.once()

    assert counts["judged"] == 7, counts
    events = list(
        LegacyEvent.objects.filter(task_id=other).order_by("id").values_list("operation", "owner_id")
    )
    assert events == [("claim", "w3"), ("release", "w3"), ("claim", "w4")]
    reasons = list(Mismatch.objects.values_list("task_id", "reason", "operation"))
    assert reasons == [(job, "STALE_COMMIT_ACCEPTED", "complete")]
    position = ObserverPosition.objects.get()
    assert position.judged == 7 and position.index == 0 and position.gtid  # MariaDB's GTID recorded
    assert observers.once()["judged"] == 0  # the position moved on


def test_a_killed_observer_resumes_judging_no_change_twice_and_skipping_none_across_a_rotated_log(
    their, operator
):
    assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201
    jobs = [task_in_both(operator, their) for _ in range(4)]
    observers.setup()
    their.sql(  # two changes in one transaction of theirs, then the log rotated, then two more
        "UPDATE jobs SET locked_by = 'w1', locked_until = UTC_TIMESTAMP(6) + INTERVAL 30 SECOND "
        "WHERE job_id IN (%s, %s)",
        jobs[:2],
    )
    their.sql("FLUSH BINARY LOGS")
    for job in jobs[2:]:
        assert claim(their, job, "w1", ttl=30)
    judged = 0

    def die() -> None:
        nonlocal judged
        judged += 1
        if judged == 2:
            raise SystemExit("the observer is killed while recording its second judgement")

    interleave.install("observe.recorded", die)
    try:
        with pytest.raises(SystemExit):
            observers.once()
    finally:
        interleave.clear()
    assert ComparedOperation.objects.filter(namespace=NS).count() == 1  # the second rolled back whole
    assert ObserverPosition.objects.get().index == 1  # in the middle of their transaction

    counts = observers.once()

    assert counts["judged"] == 3, counts  # the second, the third and the fourth — not the first again
    assert sorted(LegacyEvent.objects.values_list("task_id", flat=True)) == sorted(jobs)
    assert not Mismatch.objects.exists()
    assert observers.once()["judged"] == 0


def test_a_row_their_application_inserts_becomes_a_task_from_the_log_in_its_mapped_namespace(their, operator):
    assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201
    with their_table_configured("legacy_binlog", changed="changed_at", namespace_map={"q-billing": NS}):
        observers.setup()
        their.sql(
            "INSERT INTO jobs (job_id, queue, payload) VALUES ('late-1', 'q-billing', 'p'), ('stray', 'x', 'p')"
        )
        assert claim(their, "late-1", "w1", ttl=30)

        counts = observers.once()

    assert counts["judged"] == 1 and counts["unknown"] == 0, counts
    task = Task.objects.get(pk="late-1")
    assert (task.namespace.name, task.state, task.owner_id) == (NS, "CLAIMED", "w1")  # adopted, then judged
    assert not Task.objects.filter(pk="stray").exists()  # a queue the map does not name: of no namespace


def test_a_fence_in_observe_mode_waits_for_the_old_binaries_leases_and_says_it_cannot_refuse_them(
    their, operator, oncall
):
    from rollout.services.stages import drain_snapshot
    from tests.support.console import login

    assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201
    job = task_in_both(operator, their)
    observers.setup()
    assert claim(their, job, "w1", ttl=200)  # an old binary, straight to the table
    assert observers.once()["judged"] == 1

    assert oncall.post(f"/namespaces/{NS}/fence", {"reason": "incident"}).status_code in (200, 201)

    assert (
        drain_snapshot(namespace=NS).active_leases == 1
    )  # claim.v1 ended it; legacy's own runs on: not drained
    page = login("viewer").get(f"/ns/{NS}/incident").content.decode()
    assert "1 live in it now, and the drain waits for them" in page and "Observe mode cannot" in page
    release(their, job, "w1")  # the old binary lets go: nothing holds the task in either store
    assert drain_snapshot(namespace=NS).active_leases == 0


def test_a_key_that_is_a_task_of_another_namespace_is_never_judged_as_that_task(their, operator):
    """Task ids are global: a row of this namespace whose key another namespace's task already has is counted
    unknown — never judged against (and never changing) the other namespace's task."""
    assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201
    assert operator.post("/namespaces", {"name": "elsewhere", "stage": "SHADOW"}).status_code == 201
    taken = operator.create(namespace="elsewhere", task_id="shared-key").json()["task_id"]
    their.sql("INSERT INTO jobs (job_id, queue, payload) VALUES (%s, %s, 'p')", [taken, NS])
    observers.setup()
    assert claim(their, taken, "w1", ttl=30)

    counts = observers.once()

    assert (counts["judged"], counts["unknown"]) == (0, 1), counts
    task = Task.objects.get(pk=taken)
    assert (task.namespace.name, task.state) == ("elsewhere", "READY")
    assert not LegacyEvent.objects.exists()
