"""The change stream's pre-flight (``manage.py legacy_check --observe``, rollout.stream_check): each hazard of
observing a team's table, found before anything is created, with what to change — on a PostgreSQL cluster of its own
with wal_level = logical (scripts/legacy-pg-cluster.sh, the ``legacy_logical`` alias), on the shared one whose
wal_level is replica (``legacy``), on MariaDB with its binary log off (``legacy_mysql``: the polling observer) and on
a MariaDB of its own with the log on (``legacy_binlog``, scripts/legacy-mariadb-binlog.sh)."""

from __future__ import annotations

import json

import pytest
from django.db import connections

from rollout import legacy_check
from tests.support.legacy_db import MAPPING, Their

STREAM = [
    alias for alias in ("legacy_logical", "legacy", "legacy_mysql", "legacy_binlog") if alias in connections
]
pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", *STREAM]),
]


def _check(alias: str, **mapping) -> legacy_check.Report:
    return legacy_check.check(json.dumps({**MAPPING, "database": alias, **mapping}), observe=True)


def _problems(report: legacy_check.Report, word: str) -> list[str]:
    return [line for line in report.problems if word in line]


@pytest.fixture
def logical():
    if "legacy_logical" not in connections:
        pytest.skip("no PostgreSQL with wal_level = logical (LEGACY_OBSERVE_PG_URL; .ci/run sets it)")
    db = Their("legacy_logical")
    db.create_jobs()
    db.sql("DROP PUBLICATION IF EXISTS claim_control_plane")
    yield db
    db.sql("DROP PUBLICATION IF EXISTS claim_control_plane")
    if db.sql("SELECT 1 FROM pg_replication_slots WHERE slot_name = 'claim_control_plane'"):
        db.sql("SELECT pg_drop_replication_slot('claim_control_plane')")
    db.sql("DROP TABLE IF EXISTS jobs")


def test_postgresql_needs_replica_identity_full_and_says_how(logical):
    before = _check("legacy_logical")
    assert "wal_level is logical" in before.passed
    assert _problems(before, "ALTER TABLE jobs REPLICA IDENTITY FULL"), before.problems

    logical.sql("ALTER TABLE jobs REPLICA IDENTITY FULL")
    after = _check("legacy_logical")

    assert after.problems == [], after.problems
    assert "publication claim_control_plane does not exist yet (the observer creates it)" in after.passed


def test_a_publication_leaving_out_columns_is_refused_before_it_breaks_their_updates(logical):
    logical.sql("ALTER TABLE jobs REPLICA IDENTITY FULL")
    logical.sql("CREATE PUBLICATION claim_control_plane FOR TABLE jobs (job_id, locked_by)")

    report = _check("legacy_logical")

    assert _problems(report, "leaves out finished_by, locked_until, output, payload, queue"), report.problems
    logical.sql("ALTER PUBLICATION claim_control_plane SET TABLE jobs")
    assert _check("legacy_logical").problems == []


def test_a_role_without_replication_and_a_slot_of_another_plugin_are_refused(logical):
    logical.sql("ALTER TABLE jobs REPLICA IDENTITY FULL")
    logical.sql("SELECT pg_create_logical_replication_slot('claim_control_plane', 'test_decoding')")
    logical.sql("DROP ROLE IF EXISTS cp_no_replication")
    logical.sql("CREATE ROLE cp_no_replication")
    logical.sql("GRANT SELECT, UPDATE ON jobs TO cp_no_replication")
    try:
        logical.sql("SET ROLE cp_no_replication")
        report = _check("legacy_logical")
    finally:
        logical.sql("RESET ROLE")
        logical.sql("REVOKE ALL ON jobs FROM cp_no_replication")
        logical.sql("DROP ROLE cp_no_replication")

    assert _problems(report, "ALTER ROLE cp_no_replication REPLICATION"), report.problems
    assert _problems(report, "decodes with test_decoding"), report.problems


def test_wal_level_replica_is_refused_with_the_restart_it_needs():
    if "legacy" not in connections:
        pytest.skip("no second PostgreSQL database")
    db = Their("legacy")
    db.create_jobs()
    try:
        level = db.sql("SHOW wal_level")[0][0]
        report = _check("legacy")
    finally:
        db.sql("DROP TABLE IF EXISTS jobs")
    if level == "logical":
        pytest.skip("this cluster already has wal_level = logical")
    assert _problems(report, "set wal_level = logical and restart"), report.problems


def test_the_polling_observer_needs_an_indexed_column_every_write_changes():
    if "legacy_mysql" not in connections:
        pytest.skip("no MariaDB (LEGACY_MYSQL_URL; .ci/run sets it)")
    db = Their("legacy_mysql")
    db.create_jobs()
    try:
        unnamed = _check("legacy_mysql")
        db.sql("ALTER TABLE jobs ADD COLUMN changed_at datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)")
        unindexed = _check("legacy_mysql", changed="changed_at")
        db.sql("CREATE INDEX jobs_changed_at ON jobs (changed_at)")
        fitting = _check("legacy_mysql", changed="changed_at")
    finally:
        db.sql("DROP TABLE IF EXISTS jobs")

    assert _problems(unnamed, "needs 'changed' in the mapping"), unnamed.problems
    assert _problems(unindexed, "CREATE INDEX ON jobs (changed_at)"), unindexed.problems
    assert fitting.problems == [], fitting.problems


def test_a_per_row_counter_is_refused_as_the_polling_cursor_with_the_reason(settings):
    if "legacy_mysql" not in connections:
        pytest.skip("no MariaDB (LEGACY_MYSQL_URL; .ci/run sets it)")
    settings.LEGACY_OBSERVE_MYSQL = "poll"
    db = Their("legacy_mysql")
    db.create_jobs()
    try:
        db.sql("ALTER TABLE jobs ADD COLUMN row_version int NOT NULL DEFAULT 0, ADD INDEX (row_version)")
        report = _check("legacy_mysql", changed="row_version")
    finally:
        db.sql("DROP TABLE IF EXISTS jobs")
    assert _problems(report, "a per-row counter (a version) cannot be the cursor"), report.problems


def test_the_binlog_reader_is_chosen_where_the_log_is_on_and_each_setting_it_needs_is_checked(settings):
    """On the binlog instance every item passes; on the shared instance (log off) asking for the binlog is refused
    with what to change, and auto falls back to polling, saying so."""
    if "legacy_binlog" not in connections or "legacy_mysql" not in connections:
        pytest.skip("needs both MariaDB instances (LEGACY_MYSQL_URL, LEGACY_BINLOG_URL; .ci/run sets them)")
    with_log, without = Their("legacy_binlog"), Their("legacy_mysql")
    from examples.legacy_jobs.app import SCHEMA

    for db in (with_log, without):
        db.sql("DROP TABLE IF EXISTS jobs")
        db.sql(SCHEMA["mysql"])
    try:
        settings.LEGACY_OBSERVE_MYSQL = "auto"
        on = _check("legacy_binlog", changed="changed_at")
        unclocked = _check("legacy_binlog")
        fallback = _check("legacy_mysql", changed="changed_at")
        settings.LEGACY_OBSERVE_MYSQL = "binlog"
        off = _check("legacy_mysql", changed="changed_at")
        with_log.sql("SET GLOBAL binlog_row_image = 'MINIMAL'")
        try:
            minimal = _check("legacy_binlog", changed="changed_at")
        finally:
            with_log.sql("SET GLOBAL binlog_row_image = 'FULL'")
    finally:
        for db in (with_log, without):
            db.sql("DROP TABLE IF EXISTS jobs")

    assert on.problems == [], on.problems
    assert any("the binary log (every change" in line for line in on.passed)
    assert _problems(unclocked, "map 'changed' to an updated-at column"), unclocked.problems
    assert fallback.problems == [] and any(
        "polling the changed column (log_bin is off)" in line for line in fallback.passed
    )
    assert _problems(off, "log_bin is OFF: start the server with log_bin"), off.problems
    assert _problems(minimal, "SET GLOBAL binlog_row_image = 'FULL'"), minimal.problems
