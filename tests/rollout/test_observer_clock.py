"""Observe mode judges on legacy's clock (issue 34, point 1): every change is judged at the time legacy committed it,
in legacy's commit order, so an observer that is paused, lags or restarts reaches the verdicts of one that kept up.

The load is the example application's last-write-wins workers with a stale-overwrite injector and a ground truth kept
apart from the control plane (``examples.legacy_jobs.app.Truth``: what the table said, under the row's lock, when each
complete was written). The observer is paused for more than three legacy leases while the workers run, then catches
up while they go on: the shadow report must be the ground truth exactly — one STALE_COMMIT_ACCEPTED per stale
overwrite, no other mismatch, and every job legacy completed cleanly committed in claim.v1 with that worker's
result. Seen failing before the fix (the observer judging on its own clock): false STALE_COMMIT_ACCEPTED and
V1_REJECTED_ONLY on clean jobs, which claim.v1 then left unfinished."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from django.db import connections

from claims.models import Task
from examples.legacy_jobs.app import SCHEMA, Truth, TruthfulWorker, run_with_truth
from rollout.models import LegacyEvent, Mismatch, ObserverPosition
from rollout.services import observers
from tests.support.legacy_db import NS, Their, connect, forget_observer, task_in_both, their_table_configured

OBSERVED = [alias for alias in ("legacy_logical", "legacy_binlog") if alias in connections]
pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", *OBSERVED]),
    pytest.mark.skipif(
        not OBSERVED, reason="needs LEGACY_OBSERVE_PG_URL or LEGACY_BINLOG_URL (.ci/run sets both)"
    ),
]
LEASE = 1.0  # seconds: legacy's lease, as the run had it


@pytest.fixture(params=OBSERVED)
def their(request):
    db = Their(request.param)
    forget_observer(db)
    db.sql("DROP TABLE IF EXISTS jobs")
    db.sql(SCHEMA[db.dialect])
    if not db.mysql:
        db.sql("ALTER TABLE jobs REPLICA IDENTITY FULL")
    with their_table_configured(db.alias, **({"changed": "changed_at"} if db.mysql else {})):
        yield db
    forget_observer(db)
    db.sql("DROP TABLE IF EXISTS jobs")


def _catch_up(rounds: int = 200) -> None:
    for _ in range(rounds):
        if not observers.once()["read"]:
            return
    raise AssertionError("the observer never caught up")


def test_a_paused_observer_catches_up_to_the_ground_truth_exactly(their, operator):
    assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201
    jobs = [task_in_both(operator, their) for _ in range(30)]
    observers.setup()
    truth, stop = Truth(), threading.Event()
    workers = [
        TruthfulWorker(lambda: connect(their.alias), their.dialect, f"w{i}", ttl=LEASE, truth=truth)
        for i in range(4)
    ]
    threads = [
        threading.Thread(target=run_with_truth, args=(w, NS, stop), kwargs={"stale_every": 3}, daemon=True)
        for w in workers
    ]
    for thread in threads:
        thread.start()
    try:
        time.sleep(3.5 * LEASE)  # the observer paused for more than three leases while legacy goes on
        deadline = time.monotonic() + 4 * LEASE
        while time.monotonic() < deadline:  # it catches up while the workers keep writing
            observers.once(limit=50)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10)
    _catch_up()

    stale = Counter(truth.stale())
    assert stale, "the injector made no stale overwrite: the test proves nothing"
    found = Counter(
        (m.task_id, m.legacy["owner_id"])
        for m in Mismatch.objects.filter(namespace=NS, reason="STALE_COMMIT_ACCEPTED")
    )
    others = Counter(
        Mismatch.objects.filter(namespace=NS)
        .exclude(reason="STALE_COMMIT_ACCEPTED")
        .values_list("reason", flat=True)
    )
    print(
        f"OBSERVER-CLOCK {their.alias}: stale {sum(stale.values())}, found {sum(found.values())}, "
        f"others {dict(others)}, judged {ObserverPosition.objects.get().judged}, "
        f"completes {len(truth.completes)}"
    )
    assert found == stale  # 0 missed, 0 false
    assert not others
    clean = truth.clean()
    assert clean
    committed = dict(Task.objects.filter(pk__in=jobs, state="COMMITTED").values_list("task_id", "owner_id"))
    assert {job: committed.get(job) for job in clean} == clean  # every clean complete is claim.v1's winner
    assert LegacyEvent.objects.filter(namespace=NS, operation="complete").count() == len(truth.completes)
