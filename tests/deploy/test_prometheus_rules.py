"""The alert rules (deploy/prometheus/alerts.yml): valid for Prometheus (Debian's promtool), firing as their unit
tests say; they and the Grafana dashboard (docs/grafana-dashboard.json) read only metrics /metrics exposes."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from django.test import Client

RULES = Path(__file__).resolve().parents[2] / "deploy/prometheus"


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip(
            "needs Debian's promtool (package prometheus): scripts/install-topology.sh (.ci/run runs it)"
        )
    return path


def test_the_rules_are_valid_and_fire_as_their_unit_tests_say():
    checked = subprocess.run(
        [_promtool(), "check", "rules", "alerts.yml"], cwd=RULES, capture_output=True, text=True
    )
    tested = subprocess.run(
        [_promtool(), "test", "rules", "alerts_test.yml"], cwd=RULES, capture_output=True, text=True
    )

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert tested.returncode == 0, tested.stdout + tested.stderr


@pytest.mark.django_db
def test_every_metric_a_rule_reads_is_on_the_metrics_page(settings):
    settings.METRICS_TOKEN = ""
    page = Client().get("/metrics").content.decode()
    # Each family's "# TYPE" line is there even before it has a sample (a counter's already ends in _total); a
    # histogram's buckets end in _bucket.
    suffixes = {"histogram": ("_bucket", "_sum", "_count")}
    exposed = {
        name + suffix
        for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", page, flags=re.MULTILINE)
        for suffix in suffixes.get(kind, ("",))
    }
    dashboard = (RULES.parent.parent / "docs/grafana-dashboard.json").read_text()
    used = set(re.findall(r"\b(claims_[a-z_]+)", (RULES / "alerts.yml").read_text() + dashboard))

    assert used and used <= exposed, used - exposed
