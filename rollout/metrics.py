"""Validation coverage on /metrics (claim-v1.md §8): ``claims_validation_total{point,validated}`` and
``claims_validation_coverage_ratio{point}``. A request is validated when it is claim.v1's own — not one the rollout
passed on from the legacy API (``TaskEvent.via``). The totals are the core's folded tallies plus the unfolded
stretch (``claims.metrics.read_figures``: never a scan of the whole history); the ratio over the window comes from
the selector the gates, the API and the console use (``selectors.validation_counts``), whose scan the window's time
bounds. Registered by the app, so a core-only deployment has none."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from claims import clock
from claims.metrics import read_figures
from claims.models import Namespace

from . import selectors


class ValidationCollector(Collector):
    def describe(self) -> list:
        return []  # else registering would call collect(), i.e. query the database

    def collect(self) -> Iterator:
        total = CounterMetricFamily(
            "claims_validation",
            "Requests at acceptance points, validated or not.",
            labels=["point", "validated"],
        )
        out, _ = read_figures()
        for point in selectors.POINTS:
            for validated in ("true", "false"):
                total.add_metric(
                    [point, validated], out[("claims_validation", f"point={point},validated={validated}")]
                )
        yield total
        ratio = GaugeMetricFamily(
            "claims_validation_coverage_ratio",
            "Validated share of requests per point over ROLLOUT_WINDOW_SECONDS.",
            labels=["point"],
        )
        since = clock.now() - timedelta(seconds=settings.ROLLOUT_WINDOW_SECONDS)
        sums: dict[str, list[int]] = {point: [0, 0] for point in selectors.POINTS}
        for namespace in Namespace.objects.all():  # per namespace: the index's time bound narrows each scan
            for point, counts in selectors.validation_counts(namespace=namespace, since=since).items():
                sums[point][0] += counts["validated"]
                sums[point][1] += counts["total"]
        for point, (checked, reached) in sums.items():
            if reached:
                ratio.add_metric([point], checked / reached)
        yield ratio
        yield _by_namespace(
            "rollout_legacy_writes_pending",
            "claim.v1 decisions (V1_WRITES) not yet written through to a legacy table in another database.",
            selectors.legacy_writes_pending_by_namespace(),
        )
        yield _by_namespace(
            "rollout_direct_legacy_writes",
            "Observe mode, from V1_WRITES on: old binaries' writes straight to the legacy table, not yet reviewed.",
            selectors.direct_writes_by_namespace(),
        )
        lag = GaugeMetricFamily(
            "rollout_observer_lag_bytes",
            "WAL of the legacy table's database the observer's slot still holds (observe mode), at its last pass.",
            labels=["slot"],
        )
        behind = GaugeMetricFamily(
            "rollout_observer_last_commit_age_seconds",
            "Since the commit of the newest legacy transaction the observer judged.",
            labels=["slot"],
        )
        late = GaugeMetricFamily(
            "rollout_observer_behind_seconds",
            "How far behind legacy's clock the observer's last pass ended (0: it read all there was). Verdicts are "
            "judged on legacy's clock whatever this is; the report, the gate and the drain wait for it.",
            labels=["slot"],
        )
        lease = GaugeMetricFamily(
            "rollout_observer_lease_seconds",
            "Legacy's lease as the observer last saw one granted or renewed (expiry minus commit).",
            labels=["slot"],
        )
        now = clock.now()
        for position in selectors.observer_positions():
            if position.lag_bytes is not None:
                lag.add_metric([position.name], position.lag_bytes)
            if position.last_commit_at is not None:
                behind.add_metric([position.name], (now - position.last_commit_at).total_seconds())
            if position.behind_seconds is not None:
                late.add_metric([position.name], position.behind_seconds)
            if position.lease_seconds is not None:
                lease.add_metric([position.name], position.lease_seconds)
        yield lag
        yield behind
        yield late
        yield lease


def _by_namespace(name: str, documentation: str, counts: dict[str, int]) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(name, documentation, labels=["namespace"])
    for namespace, count in counts.items():
        gauge.add_metric([namespace], count)
    return gauge


@functools.cache
def register() -> None:
    """Once per process: the collector joins the default registry."""
    REGISTRY.register(ValidationCollector())
