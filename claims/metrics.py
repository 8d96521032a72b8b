"""The claim.v1 metrics of claim-v1.md §8. (Validation coverage — ``claims_validation_total`` and
``claims_validation_coverage_ratio`` — is the rollout's: it registers its own collector on the same registry,
``rollout/metrics.py``, and reads its totals through ``read_figures`` too.)

A scrape costs the same whatever the size of the history: the counters and histograms are the tallies the
``fold_metrics`` beat job keeps (``services.metrics_fold``) plus the figures of the records stamped since its
watermark (``tallies.figures``: the one definition both use) — a few seconds of traffic, read in one REPEATABLE READ
snapshot so a fold that commits meanwhile is counted exactly once. The figures come from the database's records,
not from process memory, so they are the same whichever web process answers, and counters never go backwards —
retention deletes only records the fold has already counted. ``claims_metrics_fold_age_seconds`` shows a fold that
stopped (the scrape then still answers correctly, only slower as the unfolded stretch grows).
"""

from __future__ import annotations

import functools
import hmac
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django_prometheus.exports import ExportToDjangoView
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from . import clock, queues, selectors, tallies
from .database import database_state
from .models import MetricTally
from .tallies import HISTOGRAMS, Figures

HELP = {
    "claims_claim": "Claim requests by outcome.",
    "claims_renew": "Renew requests by outcome.",
    "claims_commit": "Commit requests by outcome.",
    "claims_attempts_per_task": "Attempts a task had when it was committed (observed at its canonical commit).",
    "claims_reclaim_latency_seconds": "Lease expiry → the reclaiming claim.",
    "claims_ready_to_commit_seconds": "Task created (ready) → canonical commit.",
}


def read_figures() -> tuple[Figures, datetime | None]:
    """The tallies plus the unfolded stretch, from one snapshot; and when the last fold ran."""
    with selectors.metrics_snapshot() as (through, folded_at):
        out: Figures = defaultdict(float)
        for family, labels, value in MetricTally.objects.values_list("family", "labels", "value"):
            out[(family, labels)] += value
        for key, value in tallies.figures(since=through, until=None).items():
            out[key] += value
    return out, folded_at


def _labelled(out: Figures, family: str) -> list[tuple[list[str], float]]:
    rows: list[tuple[list[str], float]] = []
    for (name, labels), value in sorted(out.items()):
        if name == family:
            rows.append(([pair.partition("=")[2] for pair in labels.split(",")] if labels else [], value))
    return rows


def _histogram(out: Figures, family: str) -> HistogramMetricFamily:
    buckets, running = [], 0.0
    for bound in HISTOGRAMS[family]:
        running += out[(family, f"le={float(bound)}")]
        buckets.append((str(float(bound)), running))
    buckets.append(("+Inf", running + out[(family, "le=+Inf")]))
    histogram = HistogramMetricFamily(family, HELP[family])
    histogram.add_metric([], buckets, out[(family, "sum")])
    return histogram


class ClaimsCollector(Collector):
    def describe(self) -> list:
        # Without this the registry would call collect() — i.e. query the database — when it is registered.
        return []

    def collect(self) -> Iterator:
        out, folded_at = read_figures()
        for family in ("claims_claim", "claims_renew", "claims_commit"):
            counter = CounterMetricFamily(family, HELP[family], labels=["outcome"])
            for values, n in _labelled(out, family):
                counter.add_metric(values, n)
            yield counter
        yield CounterMetricFamily(
            "claims_contention", "Claims lost to another claimer.", value=out[("claims_contention", "")]
        )
        fenced = CounterMetricFamily(
            "claims_fenced", "Rejections by acceptance point and reason.", labels=["point", "reason"]
        )
        for values, n in _labelled(out, "claims_fenced"):
            fenced.add_metric(values, n)
        yield fenced
        yield GaugeMetricFamily(
            "claims_unknown_effects",
            "Effects whose outcome is UNKNOWN.",
            value=selectors.unknown_effects_count(),
        )
        yield CounterMetricFamily(
            "claims_discarded_compute_seconds",
            "Time attempts held tasks they did not commit (reclaimed, fenced, released, cancelled).",
            value=out[("claims_discarded_compute_seconds", "")],
        )
        for family in HISTOGRAMS:
            yield _histogram(out, family)
        age = GaugeMetricFamily(
            "claims_metrics_fold_age_seconds",
            "Seconds since fold_metrics last folded the history into the tallies (NaN: never).",
        )
        age.add_metric([], (clock.now() - folded_at).total_seconds() if folded_at else float("nan"))
        yield age
        yield from _job_families()
        yield from _database_families()
        yield from _queue_families()


def _queue_families() -> Iterator:
    """claim-v1.md §10: each namespace's READY backlog by priority, and by its largest fairness keys (the rest summed
    as ``(other)``: at most ``queues.TOP_KEYS + 1`` series a namespace, however many tenants share it)."""
    by_priority = GaugeMetricFamily(
        "claims_ready_tasks", "READY tasks by namespace and priority.", labels=["namespace", "priority"]
    )
    by_key = GaugeMetricFamily(
        "claims_ready_tasks_by_key",
        f"READY tasks of the namespace's {queues.TOP_KEYS} largest fairness keys, the rest as (other).",
        labels=["namespace", "key"],
    )
    for namespace, queue in sorted(queues.backlogs().items()):
        for priority, n in sorted(queue.by_priority.items()):
            by_priority.add_metric([namespace, str(priority)], n)
        for key, n in queue.by_key:
            by_key.add_metric([namespace, key], n)
    yield by_priority
    yield by_key


def _job_families() -> Iterator:
    """Each job's seconds since its last successful run (+Inf: none recorded), the interval beat runs it at, and
    its runs of the last hour by outcome — the Jobs page's figures (``selectors.jobs_overview``)."""
    age = GaugeMetricFamily(
        "claims_job_last_success_age_seconds",
        "Seconds since the job last finished successfully (+Inf: no success recorded).",
        labels=["task"],  # not "job": Prometheus gives every scraped series its own job label
    )
    interval = GaugeMetricFamily(
        "claims_job_interval_seconds", "How often beat sends the job (periodic jobs only).", labels=["task"]
    )
    runs = GaugeMetricFamily(
        "claims_job_runs_last_hour",
        "The job's runs that finished in the last hour, by outcome.",
        labels=["task", "outcome"],
    )
    for job in selectors.jobs_overview(clock.now(), runs=0):
        age.add_metric([job["job"]], job["age"] if job["age"] is not None else float("inf"))
        if job["interval"] is not None:
            interval.add_metric([job["job"]], job["interval"])
        for outcome, n in job["hour"].items():
            runs.add_metric([job["job"], outcome], n)
    yield age
    yield interval
    yield runs


def _database_families() -> Iterator:
    """The database the decisions are made in (issue 39; ``database.database_state``): its role, timeline and
    synchronous replication now, each standby's lag, and the failovers the control plane has recorded and fenced.
    On SQLite the families are there without samples."""
    state = database_state()
    families = {
        "claims_database_primary": GaugeMetricFamily(
            "claims_database_primary", "1 while the database answering is the primary (0: a standby)."
        ),
        "claims_database_timeline": GaugeMetricFamily(
            "claims_database_timeline", "The timeline the database writes on (a promotion moves it)."
        ),
        "claims_database_synchronous": GaugeMetricFamily(
            "claims_database_synchronous", "1 while commits wait for a synchronous standby."
        ),
        "claims_database_sync_standbys": GaugeMetricFamily(
            "claims_database_sync_standbys", "Standbys streaming as synchronous ones."
        ),
        "claims_database_history_unchecked": GaugeMetricFamily(
            "claims_database_history_unchecked",
            "1 while the database serves a timeline the control plane has not recorded (decisions wait for it).",
        ),
    }
    lag = GaugeMetricFamily(
        "claims_database_replication_lag_bytes",
        "WAL a standby has not replayed yet.",
        labels=["standby", "sync"],
    )
    failovers = CounterMetricFamily(
        "claims_database_failovers", "New timelines (or clusters) the control plane has found and recorded."
    )
    fences = CounterMetricFamily(
        "claims_database_failover_fences",
        "Failovers fenced: every namespace's epoch bumped (failover_fence).",
    )
    if state.vendor == "postgresql":
        families["claims_database_primary"].add_metric([], float(state.primary))
        families["claims_database_timeline"].add_metric([], float(state.timeline or 0))
        families["claims_database_synchronous"].add_metric([], float(state.synchronous))
        families["claims_database_sync_standbys"].add_metric([], float(state.sync_standbys))
        families["claims_database_history_unchecked"].add_metric([], float(state.unchecked))
        for standby in state.standbys:
            lag.add_metric(
                [standby.name, standby.sync_state],
                float(standby.lag_bytes) if standby.lag_bytes is not None else float("nan"),
            )
        failovers.add_metric([], float(state.failovers))
        fences.add_metric([], float(state.fences))
    yield from families.values()
    yield lag
    yield failovers
    yield fences


@functools.cache
def register() -> None:
    """Once per process: the collector joins the default registry."""
    REGISTRY.register(ClaimsCollector())


def metrics_view(request: HttpRequest) -> HttpResponse:
    """GET /metrics: no token needed unless METRICS_TOKEN is set, in which case it wants that bearer token."""
    token = settings.METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
        if not hmac.compare_digest(given.encode(), token.encode()):
            response = HttpResponse("metrics need a bearer token\n", status=401, content_type="text/plain")
            response["WWW-Authenticate"] = 'Bearer realm="metrics"'
            return response
    return ExportToDjangoView(request)
