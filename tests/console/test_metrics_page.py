"""The console's Metrics page (issue 24): it answers while workers write — an event stamped after the page read its
clock waits for the next load instead of overflowing the chart (it answered 500) — and it draws the folded
per-minute tallies, so its cost does not grow with the hour's events (bench/glance.py measures it)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction

from claims import clock
from claims.models import MinuteTally, TaskEvent
from claims.services.metrics import metrics_fold
from tests.console.test_pages import login
from tests.support.actors import make_actor


def _totals(page) -> dict[str, int]:
    return {
        "claims": page.context["claims_total"],
        "fenced": page.context["fenced_total"],
        "reclaims": page.context["reclaim"]["total"],
        "commits": page.context["ready"]["total"],
    }


def test_an_event_stamped_after_the_page_read_its_clock_waits_for_the_next_load(
    worker_a, ready_task, default_namespace
):
    """The boundary, held still: a writer's event stamped just after the page's clock reading (its statement began
    later). The page read everything stamped up to its clock; this one is the next load's."""
    viewer = login("viewer")
    claim = worker_a.claim(ready_task).json()
    worker_a.finish(claim, "done")
    late = TaskEvent.objects.filter(kind="claimed").first()
    assert late is not None
    late.pk, late.at = None, clock.now() + timedelta(seconds=20)
    late.save()

    page = viewer.get("/glance/")

    assert page.status_code == 200
    assert _totals(page) == {"claims": 1, "fenced": 0, "reclaims": 0, "commits": 1}


def test_the_page_draws_the_folded_tallies_not_the_events(worker_a, worker_b, oncall, operator, db_clock):
    """After the fold, the hour's figures come from ``MinuteTally``: with the events themselves gone (as retention
    would delete them) the page shows the same figures."""
    viewer = login("viewer")
    for _ in range(3):
        worker_a.finish(worker_a.claim(operator.create().json()["task_id"]).json(), "done")
    lapsing = operator.create().json()["task_id"]
    worker_a.claim(lapsing, ttl=1)
    db_clock.travel(2)
    worker_b.finish(worker_b.claim(lapsing).json(), "reclaimed")  # a reclaim ~1 s after expiry
    fenced = worker_b.claim(operator.create().json()["task_id"]).json()
    assert oncall.post("/namespaces/default/fence", {"reason": "drill"}).status_code == 200
    worker_b.commit_inline(fenced, "too late")  # refused FENCED
    before = _totals(viewer.get("/glance/"))
    assert before == {"claims": 6, "fenced": 1, "reclaims": 1, "commits": 4}

    db_clock.travel(60)  # past the fold's lag: the whole stretch is folded
    assert metrics_fold().figures > 0
    assert MinuteTally.objects.filter(series="claims").exists()
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL claims.retention = 'on'")  # as retention deletes
        cursor.execute("DELETE FROM claims_taskevent")  # what retention would do to old events

    assert _totals(viewer.get("/glance/")) == before


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(connection.vendor != "postgresql", reason="writers on their own connections: PostgreSQL")
def test_the_page_answers_every_load_while_workers_claim_and_commit():
    """Writers on their own connections claim and commit as fast as they can while the page is loaded 20 times:
    every load answers 200, and its totals never run ahead of the records."""
    from tests.support.actors import ensure_default_namespace

    ensure_default_namespace()
    viewer = login("viewer")
    operator = make_actor("api-operator", "operator")
    stop = threading.Event()
    errors: list[BaseException] = []

    def write(name: str) -> None:
        worker = make_actor(name, "worker")
        try:
            while not stop.is_set():
                worker.finish(worker.claim(operator.create().json()["task_id"]).json(), "done")
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)
        finally:
            connection.close()

    writers = [threading.Thread(target=write, args=(f"writer-{i}",)) for i in range(2)]
    for thread in writers:
        thread.start()
    try:
        loads = []
        for _ in range(20):
            page = viewer.get("/glance/")
            loads.append(
                (page.status_code, page.context["claims_total"] if page.status_code == 200 else None)
            )
    finally:
        stop.set()
        for thread in writers:
            thread.join()
    assert not errors
    assert [status for status, _ in loads] == [200] * 20
    claimed = TaskEvent.objects.filter(kind="claimed").count()
    assert claimed > 0 and all(total <= claimed for _, total in loads)
    counts = [total for _, total in loads]
    assert counts == sorted(counts)  # each load sees at least what the one before it saw


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_fold_committing_while_the_page_reads_is_counted_once(settings, db_clock):
    """The page has read the watermark; a fold commits before it reads the minute tallies. In its one snapshot the
    page sees the old watermark with the old tallies; read committed, it would add the newly folded minutes to the
    stretch it reads from the events as well."""
    from tests.support.actors import ensure_default_namespace
    from tests.support.races import Pause, run_in_thread

    ensure_default_namespace()
    settings.METRICS_FOLD_LAG_SECONDS = 0
    worker, operator = make_actor("w-fold", "worker"), make_actor("op-fold", "operator")
    for _ in range(3):
        worker.finish(worker.claim(operator.create().json()["task_id"]).json(), "done")
    viewer = login("viewer")
    db_clock.travel(1)
    pause = Pause("metrics.watermark_read")
    thread, box = run_in_thread(lambda: viewer.get("/glance/"))
    pause.wait_reached()

    metrics_fold()  # commits the three claims and commits into MinuteTally, and moves the watermark
    pause.resume()
    thread.join(30)

    assert MinuteTally.objects.filter(series="claims").exists()
    assert _totals(box["value"]) == {"claims": 3, "fenced": 0, "reclaims": 0, "commits": 3}
