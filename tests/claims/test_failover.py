"""Issue 39, 3 — a failover is a fence, on the test database (the real cluster's failovers are in tests/ha/).

The control plane records the history it serves from (``ServedHistory``). A history it has not recorded — made here
by recording another one, as the surviving rows look on a promoted standby — stops every decision at the statement
that takes its locks (``claims_serving_check()``, SQLSTATE P0F01): the request is answered 503 with Retry-After,
and the server first records the live history, fencing every namespace when the one before was not synchronous.
"""

from __future__ import annotations

import re

import pytest
from django.db import connection
from django.test import Client, override_settings

from claims.models import AuditEntry, Namespace, ServedHistory, Task
from claims.services.serving import serving_check, serving_live
from claims.tasks import check_serving
from tests.support.console import login
from tests.support.processes import wait_for
from tests.support.races import Pause, run_in_thread, wait_done_or_waiting

pytestmark = pytest.mark.postgres


@pytest.fixture(autouse=True)
def _postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("failover is PostgreSQL's (the embedded SQLite has none)")


def _served_before(*, timeline_step: int = 1, synchronous: bool, system: str | None = None) -> ServedHistory:
    """The history the control plane served before a switch: the live one but for its timeline (another one: the
    test database's is 1, so the one "before" is numbered after it), its cluster, or its synchronous state."""
    live = serving_live()
    return ServedHistory.objects.create(
        system_identifier=system or live.system_identifier,
        timeline=live.timeline + timeline_step,
        synchronous=synchronous if timeline_step or system else not live.synchronous,
        seen_at="2026-01-01T00:00:00Z",
        cause="test: the history before the switch",
    )


def test_a_decision_on_an_unrecorded_history_is_a_503_and_the_history_is_recorded_and_fenced(
    worker_a, ready_task, default_namespace
):
    claim = worker_a.claim(ready_task).json()
    before = _served_before(synchronous=False, system="1")  # another cluster: any timeline is new

    refused = worker_a.renew(claim)

    assert refused.status_code == 503 and refused["Retry-After"] == "1"
    assert refused.json()["outcome"] == "UNAVAILABLE" and "failed over" in refused.json()["detail"]
    latest = ServedHistory.objects.latest("id")
    assert latest.pk > before.pk and latest.fenced and "another database cluster" in latest.cause
    namespace = Namespace.objects.get(name="default")
    assert (namespace.scheduler_epoch, namespace.claims_paused) == (2, False)  # nothing to resume by hand
    entry = AuditEntry.objects.get(action="failover_fence", namespace="default")
    assert (entry.principal, entry.role, entry.reason) == ("system:failover", "system", latest.cause)
    # The token from before the switch is fenced; a claim in the new epoch goes on.
    stale = worker_a.renew(claim)
    assert stale.status_code == 409 and stale.json()["reason"] == "EPOCH"
    assert worker_a.claim(ready_task, epoch=2).status_code == 200
    assert Task.objects.get(pk=ready_task).scheduler_epoch == 2


@pytest.mark.parametrize(
    ("synchronous", "always", "fenced"),
    [(False, False, True), (True, False, False), (True, True, True)],
    ids=["asynchronous-before", "synchronous-before", "synchronous-before-always"],
)
def test_a_new_timeline_fences_unless_the_history_before_was_synchronous(
    worker_a, ready_task, default_namespace, synchronous, always, fenced
):
    claim = worker_a.claim(ready_task).json()
    _served_before(synchronous=synchronous)

    with override_settings(DATABASE_FAILOVER_FENCE="always" if always else "auto"):
        assert worker_a.renew(claim).status_code == 503
    again = worker_a.renew(claim)

    latest = ServedHistory.objects.latest("id")
    assert latest.timeline == serving_live().timeline and latest.fenced is fenced
    assert "failover: timeline" in latest.cause
    assert Namespace.objects.get(name="default").scheduler_epoch == (2 if fenced else 1)
    assert AuditEntry.objects.filter(action="failover_fence").count() == (1 if fenced else 0)
    assert again.status_code == (409 if fenced else 200), again.content


def test_synchronous_replication_switched_on_the_same_timeline_is_recorded_without_a_fence(
    worker_a, ready_task, default_namespace
):
    claim = worker_a.claim(ready_task).json()
    _served_before(timeline_step=0, synchronous=False)  # the same timeline, the other synchronous state

    assert worker_a.renew(claim).status_code == 503
    assert worker_a.renew(claim).status_code == 200

    latest = ServedHistory.objects.latest("id")
    assert not latest.fenced and latest.cause.startswith("synchronous replication")
    assert Namespace.objects.get(name="default").scheduler_epoch == 1


def test_every_decision_path_checks_the_history(worker_a, ready_task, operator, default_namespace):
    _served_before(synchronous=True)
    assert worker_a.claim(ready_task).status_code == 503
    _served_before(synchronous=True)
    assert (
        worker_a.post(
            "/claims", {"owner_id": "worker-a", "scheduler_epoch": 1, "ttl_seconds": 30}
        ).status_code
        == 503
    )
    _served_before(synchronous=True)
    created = operator.post("/tasks", {"task_id": "after-switch", "node_id": "n", "input": {}})
    assert created.status_code == 503 and not Task.objects.filter(pk="after-switch").exists()


def test_nothing_changed_is_nothing_recorded(default_namespace):
    count = ServedHistory.objects.count()

    assert serving_check() is None
    assert ServedHistory.objects.count() == count


@pytest.mark.django_db(transaction=True)
def test_checks_at_once_fence_once(default_namespace):
    """Several servers meet the new history at once. One check is paused after reading the latest row; a second
    starts meanwhile. The advisory lock makes the second wait, then find the history recorded: one row, one fence
    (epoch 2). Without the lock both recorded and both fenced (epoch 3)."""
    _served_before(synchronous=False)
    pause = Pause("serving_check.read")
    first, first_box = run_in_thread(serving_check)
    pause.wait_reached()
    second, second_box = run_in_thread(serving_check)
    wait_done_or_waiting(second_box, waiters=1)
    pause.resume()
    first.join(30)
    second.join(30)

    assert "error" not in first_box and "error" not in second_box, (first_box, second_box)
    assert first_box["value"] is not None and first_box["value"].fenced
    assert second_box["value"] is None
    assert Namespace.objects.get(name="default").scheduler_epoch == 2
    assert AuditEntry.objects.filter(action="failover_fence").count() == 1


def test_the_periodic_job_records_a_new_history_for_processes_that_answer_no_request(default_namespace):
    _served_before(synchronous=False)

    assert check_serving.delay().get() == {
        "changed": True,
        "timeline": serving_live().timeline,
        "synchronous": serving_live().synchronous,
        "fenced": True,
    }
    assert check_serving.delay().get() == {"changed": False}
    assert Namespace.objects.get(name="default").scheduler_epoch == 2


@pytest.mark.django_db(transaction=True)
def test_the_periodic_job_runs_in_a_real_worker_process(celery_worker_process, default_namespace):
    _served_before(synchronous=False)

    check_serving.delay()

    assert wait_for(lambda: AuditEntry.objects.filter(action="failover_fence").exists())
    assert ServedHistory.objects.latest("id").fenced
    assert Namespace.objects.get(name="default").scheduler_epoch == 2


def _metric(page: str, name: str) -> float:
    match = re.search(rf"^{name} (\S+)$", page, flags=re.MULTILINE)
    assert match, f"{name} is not on /metrics"
    return float(match.group(1))


def test_metrics_and_the_incident_header_show_the_database_and_its_failovers(worker_a, ready_task, settings):
    settings.METRICS_TOKEN = ""
    live = serving_live()
    before = Client().get("/metrics").content.decode()
    assert _metric(before, "claims_database_primary") == 1
    assert _metric(before, "claims_database_timeline") == live.timeline
    assert _metric(before, "claims_database_synchronous") == float(live.synchronous)
    assert _metric(before, "claims_database_history_unchecked") == 0
    failovers = _metric(before, "claims_database_failovers_total")

    _served_before(synchronous=False)
    unchecked = Client().get("/metrics").content.decode()
    rows = ServedHistory.objects.count()
    assert _metric(unchecked, "claims_database_history_unchecked") == 1
    assert ServedHistory.objects.count() == rows  # a read never records, nor fences
    claim = worker_a.claim(ready_task)
    assert claim.status_code == 503

    after = Client().get("/metrics").content.decode()
    # Two new histories recorded: the one this test made up to stand for "before", then the live one again.
    assert _metric(after, "claims_database_failovers_total") == failovers + 2
    assert _metric(after, "claims_database_failover_fences_total") >= 1
    assert _metric(after, "claims_database_history_unchecked") == 0
    page = login("viewer").get("/ns/default/incident")
    database = page.context["incident"]["database"]
    assert database.timeline == live.timeline and database.last_failover_fenced
    assert b'id="db-fenced"' in page.content and b'timeline <strong id="db-timeline">' in page.content


@pytest.mark.django_db(transaction=True)
def test_a_statement_prepared_before_a_migration_changed_its_table_is_a_503_then_served(operator, worker_a):
    """Prepared statements are on by default (controlplane/settings/base.py). A migration that adds a column while a
    server runs changes what the claim's ``SELECT c.*`` returns: PostgreSQL refuses the statement that server
    prepared before ("cached plan must not change result type"). That request is a 503 to retry — never a 500 — it
    decided nothing, and the retry is served (psycopg forgets its prepared statements on the rollback)."""
    import psycopg

    from claims.models import Attempt

    assert connection.settings_dict["OPTIONS"].get("prepare_threshold") is not None, (
        "prepared statements are off"
    )
    for i in range(4):
        assert operator.create(node_id="build", input={"i": i}).status_code == 201
    for _ in range(3):  # run often enough to be prepared on this connection
        assert worker_a.claim_next().status_code == 200
    dsn = connection.get_connection_params()
    other = psycopg.connect(
        **{k: v for k, v in dsn.items() if k in ("dbname", "user", "host", "port")}, autocommit=True
    )
    try:
        other.execute("ALTER TABLE claims_task ADD COLUMN added_by_a_migration integer")
        attempts = Attempt.objects.count()

        refused = worker_a.claim_next()

        assert refused.status_code == 503 and refused["Retry-After"] == "1", refused.content
        assert refused.json()["outcome"] == "UNAVAILABLE" and "retry" in refused.json()["detail"]
        assert Attempt.objects.count() == attempts  # nothing decided
        served = worker_a.claim_next()
        assert served.status_code == 200 and Attempt.objects.count() == attempts + 1
        committed = worker_a.commit_inline(served.json(), {"ok": True})  # the commit's ``t.*`` too
        assert committed.status_code == 200, committed.content
        assert Task.objects.get(pk=served.json()["task_id"]).state == "COMMITTED"
    finally:
        other.execute("ALTER TABLE claims_task DROP COLUMN IF EXISTS added_by_a_migration")
        other.close()
        connection.close()  # this connection's statements were prepared with the column
