"""The legacy-table soak drill, short (issue 34, point 8; bench/legacy_soak.py runs it for 30 minutes): 8
last-write-wins workers with the stale-overwrite injector and a ground truth kept apart from the control plane, rows
inserted all along; in observe mode the observer is a process of its own, killed and restarted twice and paused past
three leases; then V1_WRITES with old binaries still writing, a forced rollback checked row by row, a re-advance. The
soak itself asserts the report equals the ground truth exactly (0 false, 0 missed) and every mapped column of every
row equals claim.v1 after the rollback; here on PostgreSQL (change stream, and proxy mode) and MariaDB's binlog."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from django.db import connections

from tests.support.legacy_db import their_table_configured

ROOT = Path(__file__).resolve().parents[2]
RUNS = [
    (alias, mode)
    for alias, mode in (("legacy_logical", "observe"), ("legacy_binlog", "observe"), ("legacy", "proxy"))
    if alias in connections
]
pytestmark = [
    pytest.mark.postgres,
    pytest.mark.timeout(300),
    pytest.mark.django_db(
        transaction=True, databases=["default", *sorted({alias for alias, _ in RUNS})]
    ),  # only the databases configured: each run's own (a missing one is no error, its run is not there)
    pytest.mark.skipif(
        not RUNS,
        reason="needs a legacy database: LEGACY_OBSERVE_PG_URL, LEGACY_BINLOG_URL or PostgreSQL's DATABASE_URL",
    ),
]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_legacy_soak", ROOT / "bench" / "legacy_soak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("alias", "mode"), RUNS)
def test_a_short_soak_matches_the_ground_truth_and_the_rollback_leaves_every_row_equal(alias, mode, settings):
    bench = _bench()
    namespace = f"soak-{mode}-{alias.replace('_', '-')}"
    mysql = connections[alias].vendor == "mysql"
    mapping = {
        **bench.MAPPING,
        "namespace_map": {"soak": namespace},
        **({"changed": "changed_at"} if mysql else {}),
    }
    settings.LEGACY_POLL_MARGIN_SECONDS = 0.3
    observer_env = {
        "DATABASE_URL": bench._db_url("default"),
        "LEGACY_DATABASE_URL": bench._db_url(alias),
        "ROLLOUT_LEGACY_STORE": "rollout.legacy_table.TableLegacyStore",
        "ROLLOUT_LEGACY_TABLE": json.dumps(mapping),
    }
    extra = {key: value for key, value in mapping.items() if key not in ("table", "key", "owner", "expires")}
    with their_table_configured(alias, **extra):
        figures = bench.soak(
            mode=mode,
            seconds=14
            if mode == "observe"
            else 10,  # observe: the shadow run (0.8 of it) outlasts ten leases
            namespace=namespace,
            legacy_alias=alias,
            lease=1.0 if mode == "observe" else 2.0,
            observer_env=observer_env,
        )

    print("\nSOAK " + json.dumps(figures))
    assert all(phase["false"] == 0 and phase["missed"] == 0 for phase in figures["truth"])
    assert figures["truth"][-1]["stale_overwrites"] > 0
    assert figures["rollback"]["rows_unequal"] == 0 and figures["rollback"]["rows_checked"] > 0
    if mode == "observe":
        assert figures["observer"]["killed_and_restarted"] == 2 and figures["observer"]["judged"] > 0
