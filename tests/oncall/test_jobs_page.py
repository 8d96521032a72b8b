"""Dead jobs are seen (issue 25, points 4 and 6): every Celery job's runs are recorded by the process that ran them
— eagerly and through a real worker on Redis —; /metrics exposes each job's age since its last success, its
interval and its outcomes of the last hour (the alert rules JobBehind and JobFailing read them: promtool tests them,
tests/deploy/test_prometheus_rules.py); the console's Jobs page lists each job, marks one behind, and shows its
last runs with durations and errors."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from claims.models import JobRun
from claims.tasks import reap_expired_leases
from oncall.tasks import fence_epoch
from tests.support.console import login
from tests.support.processes import wait_for


def _gauge(text: str, name: str, labels: str) -> float:
    match = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    assert match, f"{name}{{{labels}}} not on /metrics: " + "\n".join(
        line for line in text.splitlines() if line.startswith(name)
    )
    return float(match.group(1))


def test_runs_are_recorded_exposed_and_listed_with_their_errors(db, settings):
    settings.METRICS_TOKEN = ""
    reap_expired_leases.delay()
    failed = fence_epoch.apply(
        args=("default", "drill", "nobody-by-that-name"), throw=False
    )  # no such principal

    assert failed.state == "FAILURE"
    runs = {(r.job, r.outcome) for r in JobRun.objects.all()}
    assert runs == {("claims.reap_expired_leases", "SUCCESS"), ("oncall.fence_epoch", "FAILURE")}
    assert "DoesNotExist" in JobRun.objects.get(outcome="FAILURE").error

    text = Client().get("/metrics").content.decode()
    assert _gauge(text, "claims_job_last_success_age_seconds", 'task="claims.reap_expired_leases"') < 60
    assert _gauge(text, "claims_job_last_success_age_seconds", 'task="claims.fold_metrics"') == float("inf")
    assert _gauge(text, "claims_job_interval_seconds", 'task="claims.fold_metrics"') == 15
    assert _gauge(text, "claims_job_runs_last_hour", 'outcome="FAILURE",task="oncall.fence_epoch"') == 1

    page = login("viewer").get("/jobs/")
    jobs = {j["job"]: j for j in page.context["jobs"]}
    assert not jobs["claims.reap_expired_leases"]["behind"] and jobs["claims.fold_metrics"]["behind"]
    assert (
        jobs["oncall.fence_epoch"]["interval"] is None and jobs["oncall.fence_epoch"]["hour"]["FAILURE"] == 1
    )
    assert b'id="claims.fold_metrics"' in page.content and b"DoesNotExist" in page.content


@pytest.mark.django_db(transaction=True)
def test_a_real_worker_records_the_runs_it_makes(celery_workers):
    celery_workers.start()

    reap_expired_leases.delay()

    assert wait_for(lambda: JobRun.objects.filter(job="claims.reap_expired_leases").exists(), 60)
    run = JobRun.objects.get(job="claims.reap_expired_leases")
    assert run.outcome == "SUCCESS" and run.finished_at >= run.started_at
