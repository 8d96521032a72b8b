"""The record of every Celery job's runs (``JobRun``): written when a run ends, from Celery's signals
(``claims.job_signals``), whatever app the job belongs to. A failure to record never fails the job."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import DatabaseError, transaction

from .. import clock
from ..models import JobRun

logger = logging.getLogger(__name__)


def job_record(*, job: str, started_at: datetime, outcome: str, error: str = "") -> JobRun | None:
    """Append one finished run; runs older than ``JOB_RUNS_KEEP_HOURS`` of the same job go with it."""
    try:
        with transaction.atomic():
            now = clock.now()
            run = JobRun.objects.create(
                job=job, started_at=started_at, finished_at=now, outcome=outcome, error=error[:2000]
            )
            JobRun.objects.filter(
                job=job, finished_at__lt=now - timedelta(hours=settings.JOB_RUNS_KEEP_HOURS)
            ).delete()
            return run
    except DatabaseError as exc:  # the job's own work is done (or failed on its own): only the record is lost
        logger.warning("could not record a run of %s: %s", job, exc)
        return None
