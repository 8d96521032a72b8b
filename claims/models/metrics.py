"""What /metrics reads instead of the whole history (claim-v1.md §8, issue 13): the timeline and the attempts are
folded into running tallies by the ``fold_metrics`` beat job, so a scrape costs the tallies plus the few seconds of
records written since the last fold — the same at a million committed tasks as at ten thousand — and counters stay
monotonic when retention deletes the records they were counted from."""

from __future__ import annotations

from django.db import models


class MetricFold(models.Model):
    """The one watermark (``name="claims"``): every timeline event and every attempt end stamped before ``through``
    is in the tallies; nothing stamped at or after it is. Moved forward only by ``services.metrics_fold``."""

    name = models.CharField(max_length=32, primary_key=True)
    through = models.DateTimeField()
    folded_at = models.DateTimeField(null=True, blank=True)  # None: never folded yet


class MetricTally(models.Model):
    """One folded figure: a counter's value for one label set (``labels``: ``k=v`` pairs joined by ``,``, in the
    collector's order), or one histogram bucket (``le=…``, not cumulative), its ``sum`` and ``count``."""

    family = models.CharField(max_length=64)
    labels = models.CharField(max_length=200, blank=True, default="")
    value = models.FloatField(default=0.0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["family", "labels"], name="metric_tally_once")]


class MinuteTally(models.Model):
    """One folded figure of one namespace in one minute — what the console's Metrics page draws
    (``tallies.per_minute``: claims, commits, fenced commits, and the latency buckets): the page then costs its
    hour's rows plus the unfolded stretch, however many events the hour holds. The fold keeps the last
    ``MINUTE_TALLY_HOURS`` and deletes older minutes."""

    namespace_id = models.BigIntegerField()
    minute = models.DateTimeField()
    series = models.CharField(max_length=40)
    value = models.FloatField(default=0.0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["minute", "namespace_id", "series"], name="minute_tally_once")
        ]


class JobRun(models.Model):
    """One finished run of a Celery job — any app's — appended when it ends (``services.jobs.job_record``, from
    Celery's signals): what the Jobs page lists and /metrics' job ages and outcome counts read. A run killed
    before it ended leaves no row; its job's age since the last success keeps growing, which is what pages
    someone. Kept ``JOB_RUNS_KEEP_HOURS``."""

    job = models.CharField(max_length=100)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    outcome = models.CharField(max_length=16)  # SUCCESS | FAILURE | RETRY
    error = models.TextField(blank=True, default="")

    class Meta:
        indexes = [models.Index(fields=["job", "-finished_at"], name="jobrun_job_finished")]
