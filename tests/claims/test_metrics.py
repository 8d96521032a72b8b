"""GET /metrics: the §8 metrics, read from the database, so every process reports the same figures."""

from __future__ import annotations

import re

import pytest


def _sample(text: str, name: str, labels: str = "") -> float:
    pattern = rf"^{re.escape(name)}{re.escape(labels)} ([0-9.e+-]+)$"
    match = re.search(pattern, text, re.M)
    assert match, f"{name}{labels} not in /metrics"
    return float(match.group(1))


def test_metrics_report_claims_fences_coverage_and_effects(
    anonymous, worker_a, worker_b, ready_task, db_clock, oncall
):
    claim = worker_a.claim(ready_task, ttl=5).json()
    worker_b.claim(ready_task)  # contention
    key = worker_a.prepare(claim, "notify", 1).json()["effect_id"]
    worker_a.outcome(claim, key, "UNKNOWN")
    db_clock.travel(6)
    claim_b = worker_b.claim(ready_task).json()  # a reclaim, 1 s after expiry
    worker_a.renew(claim)  # fenced: generation
    worker_b.finish(claim_b, "done")

    text = anonymous.get("/metrics").content.decode()

    assert _sample(text, "claims_claim_total", '{outcome="CLAIMED"}') == 2
    assert _sample(text, "claims_claim_total", '{outcome="NOT_CLAIMABLE"}') == 1
    assert _sample(text, "claims_contention_total") == 1
    assert _sample(text, "claims_renew_total", '{outcome="FENCED"}') == 1
    assert _sample(text, "claims_commit_total", '{outcome="COMMITTED"}') == 1
    assert _sample(text, "claims_fenced_total", '{point="renew",reason="GENERATION"}') == 1
    assert _sample(text, "claims_unknown_effects") == 1
    assert _sample(text, "claims_reclaim_latency_seconds_count") == 1
    assert _sample(text, "claims_reclaim_latency_seconds_bucket", '{le="2.0"}') == 1
    assert _sample(text, "claims_attempts_per_task_bucket", '{le="2.0"}') == 1
    assert _sample(text, "claims_ready_to_commit_seconds_count") == 1
    assert _sample(text, "claims_discarded_compute_seconds_total") >= 6


def test_metrics_want_the_token_when_one_is_set(anonymous, settings, db):
    settings.METRICS_TOKEN = "s3cret-metrics-token"

    refused = anonymous.get("/metrics")
    allowed = anonymous.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-metrics-token")

    assert refused.status_code == 401 and allowed.status_code == 200


@pytest.mark.parametrize("name", ["claims_claim_total", "claims_fenced_total", "claims_unknown_effects"])
def test_metric_names_are_exposed_even_before_traffic(anonymous, db, name):
    assert name.removesuffix("_total") in anonymous.get("/metrics").content.decode()
