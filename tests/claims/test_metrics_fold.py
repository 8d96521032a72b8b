"""/metrics from folded tallies (issue 13 item 7): the ``fold_metrics`` job moves the history into ``MetricTally``
rows and a scrape adds the records written since, so a fold never changes a figure, nothing is counted twice, and
nothing stamped inside a transaction still open when the fold runs is left behind its watermark."""

from __future__ import annotations

import re

import pytest

from claims.metrics import read_figures
from claims.models import MetricFold, MetricTally
from claims.services.metrics import metrics_fold
from tests.support.races import Pause, run_in_thread

FOLD_AGE = "claims_metrics_fold_age_seconds"


NOT_FROM_THE_RECORDS = ("claims_http_request_duration_seconds", "claims_job_last_success_age_seconds")


def _figures(text: str) -> dict[str, float]:
    """Every sample on /metrics read from the records, but the fold's own age (the one figure a fold is meant to
    change): not this process's request timings (each request, the scrape too, adds to them) nor the jobs' ages
    (the clock moves them)."""
    out = {}
    for line in text.splitlines():
        if (
            line.startswith("claims_")
            and not line.startswith((FOLD_AGE, *NOT_FROM_THE_RECORDS))
            and "_created" not in line
        ):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _sample(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$", text, re.M)
    assert match, f"{name}{labels} not in /metrics"
    return float(match.group(1))


def _traffic(worker_a, worker_b, task_id, db_clock) -> None:
    claim = worker_a.claim(task_id, ttl=5).json()
    worker_b.claim(task_id)  # contention
    db_clock.travel(6)
    claim_b = worker_b.claim(task_id).json()  # a reclaim
    worker_a.renew(claim)  # fenced: generation
    worker_b.finish(claim_b, "done")


def test_a_fold_moves_the_history_into_tallies_and_changes_no_figure(
    anonymous, worker_a, worker_b, operator, ready_task, db_clock, settings
):
    settings.METRICS_FOLD_LAG_SECONDS = 0
    _traffic(worker_a, worker_b, ready_task, db_clock)
    before = anonymous.get("/metrics").content.decode()

    db_clock.travel(1)
    folded = metrics_fold()
    after = anonymous.get("/metrics").content.decode()

    assert folded.figures > 0 and MetricTally.objects.filter(family="claims_claim").exists()
    assert MetricFold.objects.get(name="claims").through == folded.through
    assert _figures(after) == _figures(before)
    assert _sample(after, "claims_claim_total", '{outcome="CLAIMED"}') == 2
    assert _sample(after, "claims_commit_total", '{outcome="COMMITTED"}') == 1
    assert _sample(after, FOLD_AGE) < 5

    # What comes after the fold is added on top of the tallies, once; a second fold changes nothing either.
    second = operator.create().json()["task_id"]
    worker_a.finish(worker_a.claim(second).json(), "also done")
    later = anonymous.get("/metrics").content.decode()
    db_clock.travel(1)
    metrics_fold()
    folded_again = anonymous.get("/metrics").content.decode()

    assert _sample(later, "claims_claim_total", '{outcome="CLAIMED"}') == 3
    assert _sample(later, "claims_commit_total", '{outcome="COMMITTED"}') == 2
    assert _figures(folded_again) == _figures(later)


def test_a_fold_before_the_lag_has_passed_folds_nothing(worker_a, ready_task, settings):
    settings.METRICS_FOLD_LAG_SECONDS = 600
    worker_a.claim(ready_task)

    folded = metrics_fold()

    assert folded.figures == 0 and not MetricTally.objects.exists()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_commit_open_while_the_fold_runs_is_counted_once_after_it_commits(
    anonymous, worker_a, ready_task, settings
):
    """The commit has read its clock (its event's ``at``) and holds its locks, not yet written; the fold runs then.
    Cutting at the fold's own clock would put the event behind the watermark when it commits — counted by neither the
    tallies nor the scrape. The fold cuts before the oldest open transaction began instead."""
    settings.METRICS_FOLD_LAG_SECONDS = 0
    claim = worker_a.claim(ready_task).json()
    pause = Pause("task_commit.checked")
    thread, box = run_in_thread(lambda: worker_a.commit_inline(claim, "result"))
    pause.wait_reached()

    metrics_fold()
    pause.resume()
    thread.join(30)
    assert box["value"].status_code == 200, box
    metrics_fold()

    text = anonymous.get("/metrics").content.decode()
    assert _sample(text, "claims_commit_total", '{outcome="COMMITTED"}') == 1
    assert read_figures()[0][("claims_commit", "outcome=COMMITTED")] == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_fold_committing_during_a_scrape_is_counted_once(
    anonymous, worker_a, ready_task, db_clock, settings
):
    """The scrape has read the watermark; a fold commits before it reads the tallies. In one snapshot the scrape
    sees the old watermark with the old tallies; read committed, it would add the new tallies to the stretch they
    already hold."""
    settings.METRICS_FOLD_LAG_SECONDS = 0
    worker_a.finish(worker_a.claim(ready_task).json(), "done")
    db_clock.travel(1)
    pause = Pause("metrics.watermark_read")
    thread, box = run_in_thread(lambda: anonymous.get("/metrics").content.decode())
    pause.wait_reached()

    metrics_fold()
    pause.resume()
    thread.join(30)

    assert _sample(box["value"], "claims_commit_total", '{outcome="COMMITTED"}') == 1
    assert _sample(box["value"], "claims_claim_total", '{outcome="CLAIMED"}') == 1
    assert MetricTally.objects.get(family="claims_commit", labels="outcome=COMMITTED").value == 1
