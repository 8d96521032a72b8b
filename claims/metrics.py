"""The claim.v1 metrics of claim-v1.md §8, read from the database at scrape time. (Validation coverage —
``claims_validation_total`` and ``claims_validation_coverage_ratio`` — is the rollout's: it registers its own
collector on the same registry, ``rollout/metrics.py``.)

Every figure is derived from append-only records (the timeline, attempts, effects), so it is the same whichever
web process or Celery worker answers the scrape, and counters never go backwards. Each scrape runs a handful of
aggregate queries; histograms are bucketed in SQL.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator, Sequence

from django.conf import settings
from django.db.models import Count, F, Q, Sum
from django.http import HttpRequest, HttpResponse
from django_prometheus.exports import ExportToDjangoView
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from . import selectors
from .models import AcceptancePoint, Attempt, AttemptEnd, EventKind, TaskEvent

LATENCY_BUCKETS = [0.1, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600]
ATTEMPT_BUCKETS = [1, 2, 3, 4, 5, 8, 13]


def _histogram(
    name: str, doc: str, values: Sequence[float], buckets: Sequence[float]
) -> HistogramMetricFamily:
    counts: list[tuple[str, float]] = []
    ordered = sorted(values)
    index = 0
    for bound in buckets:
        while index < len(ordered) and ordered[index] <= bound:
            index += 1
        counts.append((str(float(bound)), index))
    counts.append(("+Inf", len(ordered)))
    total = sum(ordered)
    family = HistogramMetricFamily(name, doc)
    family.add_metric([], counts, total)
    return family


def _outcome_counts(point: str, success_kinds: list[str], success_word: str) -> dict[str, int]:
    rows = (
        TaskEvent.objects.filter(Q(kind__in=success_kinds) | Q(kind=EventKind.FENCED, point=point))
        .values("kind", "detail__outcome")
        .annotate(n=Count("id"))
    )
    out: dict[str, int] = {}
    for row in rows:
        word = success_word if row["kind"] in success_kinds else (row["detail__outcome"] or "FENCED")
        out[word] = out.get(word, 0) + row["n"]
    return out


class ClaimsCollector(Collector):
    def describe(self) -> list:
        # Without this the registry would call collect() — i.e. query the database — when it is registered.
        return []

    def collect(self) -> Iterator:
        claim = CounterMetricFamily("claims_claim", "Claim requests by outcome.", labels=["outcome"])
        for word, n in _outcome_counts(
            AcceptancePoint.CLAIM, [EventKind.CLAIMED, EventKind.RECLAIMED], "CLAIMED"
        ).items():
            claim.add_metric([word], n)
        yield claim

        renew = CounterMetricFamily("claims_renew", "Renew requests by outcome.", labels=["outcome"])
        for word, n in _outcome_counts(AcceptancePoint.RENEW, [EventKind.RENEWED], "RENEWED").items():
            renew.add_metric([word], n)
        yield renew

        commit = CounterMetricFamily("claims_commit", "Commit requests by outcome.", labels=["outcome"])
        for word, n in _outcome_counts(
            AcceptancePoint.COMMIT, [EventKind.RESULT_COMMITTED], "COMMITTED"
        ).items():
            commit.add_metric([word], n)
        yield commit

        contention = TaskEvent.objects.filter(
            kind=EventKind.FENCED,
            point=AcceptancePoint.CLAIM,
            detail__reason__in=["LEASE_LIVE", "VERSION_MISMATCH"],
        ).count()
        yield CounterMetricFamily("claims_contention", "Claims lost to another claimer.", value=contention)

        fenced = CounterMetricFamily(
            "claims_fenced", "Rejections by acceptance point and reason.", labels=["point", "reason"]
        )
        for row in (
            TaskEvent.objects.filter(kind=EventKind.FENCED)
            .values("point", "detail__reason")
            .annotate(n=Count("id"))
            .order_by("point", "detail__reason")
        ):
            fenced.add_metric([row["point"] or "", row["detail__reason"] or ""], row["n"])
        yield fenced

        yield GaugeMetricFamily(
            "claims_unknown_effects",
            "Effects whose outcome is UNKNOWN.",
            value=selectors.unknown_effects_count(),
        )

        discarded = (
            Attempt.objects.filter(ended_at__isnull=False)
            .exclude(end_reason=AttemptEnd.COMMITTED)
            .aggregate(total=Sum(F("ended_at") - F("started_at")))["total"]
        )
        yield CounterMetricFamily(
            "claims_discarded_compute_seconds",
            "Time attempts held tasks they did not commit (reclaimed, fenced, released, cancelled).",
            value=discarded.total_seconds() if discarded else 0.0,
        )

        per_task = [row["n"] for row in Attempt.objects.values("task_id").annotate(n=Count("pk"))]
        yield _histogram("claims_attempts_per_task", "Attempts per claimed task.", per_task, ATTEMPT_BUCKETS)

        reclaims = selectors.reclaim_latencies()
        yield _histogram(
            "claims_reclaim_latency_seconds",
            "Lease expiry → the reclaiming claim.",
            reclaims,
            LATENCY_BUCKETS,
        )

        ready_to_commit = selectors.ready_to_commit_seconds()
        yield _histogram(
            "claims_ready_to_commit_seconds",
            "Task created (ready) → canonical commit.",
            ready_to_commit,
            LATENCY_BUCKETS,
        )


_registered = False


def register() -> None:
    global _registered
    if not _registered:
        REGISTRY.register(ClaimsCollector())
        _registered = True


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
