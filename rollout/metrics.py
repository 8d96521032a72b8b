"""Validation coverage on /metrics (claim-v1.md §8): ``claims_validation_total{point,validated}`` and
``claims_validation_coverage_ratio{point}``. A request is validated when it is claim.v1's own — not one the rollout
passed on from the legacy API (``TaskEvent.via``). Read at scrape time from the same selector the gates, the API
and the console use (``selectors.validation_counts``); registered by the app, so a core-only deployment has none."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

from django.conf import settings
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from claims import clock

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
        for point, counts in selectors.validation_counts().items():
            total.add_metric([point, "true"], counts["validated"])
            total.add_metric([point, "false"], counts["total"] - counts["validated"])
        yield total
        ratio = GaugeMetricFamily(
            "claims_validation_coverage_ratio",
            "Validated share of requests per point over ROLLOUT_WINDOW_SECONDS.",
            labels=["point"],
        )
        since = clock.now() - timedelta(seconds=settings.ROLLOUT_WINDOW_SECONDS)
        for point, counts in selectors.validation_counts(since=since).items():
            if counts["total"]:
                ratio.add_metric([point], counts["validated"] / counts["total"])
        yield ratio


_registered = False


def register() -> None:
    global _registered
    if not _registered:
        REGISTRY.register(ValidationCollector())
        _registered = True
