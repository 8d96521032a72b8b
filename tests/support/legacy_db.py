"""A team's own legacy database for the tests of the legacy table adapter (rollout.legacy_table) and what rides on
it: a second PostgreSQL database (the ``legacy`` alias) and MariaDB (``legacy_mysql``, where LEGACY_MYSQL_URL is
set, as .ci/run sets it) — their table, with their column names, and their dialect for what a test does there."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC

from django.conf import settings
from django.db import connections

from examples.legacy_jobs.app import MAPPING  # the example application's table is the one the tests use
from rollout import legacy, legacy_table

ALIASES = [alias for alias in ("legacy", "legacy_mysql") if alias in connections]


class Their:
    """The team's database: its dialect for what the tests do there themselves."""

    def __init__(self, alias: str):
        self.alias = alias
        self.mysql = connections[alias].vendor == "mysql"
        self.dialect = connections[alias].vendor
        self.now = "UTC_TIMESTAMP(6)" if self.mysql else "clock_timestamp()"

    def sql(self, statement: str, params: list | None = None) -> list[tuple]:
        with connections[self.alias].cursor() as cursor:
            cursor.execute(statement, params or [])
            return list(cursor.fetchall()) if cursor.description else []

    def create_jobs(self) -> None:
        self.sql("DROP TABLE IF EXISTS jobs")
        if self.mysql:
            self.sql(
                "CREATE TABLE jobs (job_id varchar(64) PRIMARY KEY, queue varchar(64) NOT NULL, payload text NOT "
                "NULL, locked_by varchar(200), locked_until datetime(6) NULL, output json, finished_by varchar(200))"
            )
        else:
            self.sql(
                "CREATE TABLE jobs (job_id varchar(64) PRIMARY KEY, queue text NOT NULL, payload text NOT NULL, "
                "locked_by text, locked_until timestamptz, output jsonb, finished_by text)"
            )

    def plus(self, seconds: int) -> str:
        """SQL for the database's clock plus ``seconds``."""
        if self.mysql:
            return f"{self.now} + INTERVAL {seconds} SECOND"
        return f"{self.now} + interval '{seconds} second'"

    def lock_waiters(self) -> int:
        if self.mysql:
            # MariaDB waits for a key lookup's row lock while still planning the statement (state "Statistics"),
            # before InnoDB lists it as LOCK WAIT: a locking read in progress on another session is the waiter.
            return self.sql(
                "SELECT count(*) FROM information_schema.processlist WHERE id <> CONNECTION_ID() "
                "AND info LIKE '%%FOR UPDATE%%'"
            )[0][0]
        return self.sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )[0][0]

    def tables(self) -> set[str]:
        if self.mysql:
            return {name for (name,) in self.sql("SHOW TABLES")}
        return {
            name
            for (name,) in self.sql("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        }


def aware(value):
    return value if value is None or value.tzinfo else value.replace(tzinfo=UTC)


def output_of(value):
    return json.loads(value) if isinstance(value, str) else value


def row(their, job_id: str) -> tuple:
    owner, until, output, finished_by, payload = their.sql(
        "SELECT locked_by, locked_until, output, finished_by, payload FROM jobs WHERE job_id = %s", [job_id]
    )[0]
    return owner, aware(until), output_of(output), finished_by, payload


def wait_for_a_lock_waiter(their, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if their.lock_waiters():
            return
        time.sleep(0.02)
    raise AssertionError("the adapter never waited for the row")


NS = "wt"  # the namespace the tests migrate


def use_their_table(alias: str, **mapping: str):
    """Settings as a team sets them: the shipped adapter over their table (env: ROLLOUT_LEGACY_STORE and
    ROLLOUT_LEGACY_TABLE)."""
    return {
        "ROLLOUT_LEGACY_STORE": "rollout.legacy_table.TableLegacyStore",
        "ROLLOUT_LEGACY_TABLE": json.dumps({**MAPPING, "database": alias, **mapping}),
    }


@contextmanager
def their_table_configured(alias: str, **mapping: str) -> Iterator[None]:
    """This process configured as ``use_their_table`` says (the store and its mapping are cached: cleared);
    ``mapping``: keys of the mapping added."""
    values = use_their_table(alias, **mapping)
    saved = {name: getattr(settings, name) for name in values}
    try:
        for name, value in values.items():
            setattr(settings, name, value)
        legacy.legacy_store.cache_clear()
        legacy_table.configured_mapping.cache_clear()
        yield
    finally:
        for name, value in saved.items():
            setattr(settings, name, value)
        legacy.legacy_store.cache_clear()
        legacy_table.configured_mapping.cache_clear()


def task_in_both(operator, their, namespace: str = NS) -> str:
    """A task of ours, and the same job in their table (their table is the list of their work)."""
    task_id = operator.create(namespace=namespace).json()["task_id"]
    their.sql("INSERT INTO jobs (job_id, queue, payload) VALUES (%s, %s, 'p')", [task_id, namespace])
    return task_id


def connect(alias: str):
    """A DB-API connection to their database, as their workers open one (not the control plane's): autocommit."""
    db = connections[alias].settings_dict
    if connections[alias].vendor == "mysql":
        import MySQLdb

        conn = MySQLdb.connect(
            host=db["HOST"] or "127.0.0.1",
            port=int(db["PORT"] or 3306),
            user=db["USER"],
            passwd=db["PASSWORD"] or "",
            db=db["NAME"],
            autocommit=True,
        )
        conn.cursor().execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        return conn
    import psycopg

    return psycopg.connect(
        host=db["HOST"] or "127.0.0.1",
        port=int(db["PORT"] or 5432),
        user=db["USER"],
        dbname=db["NAME"],
        autocommit=True,
    )


def forget_observer(db: Their) -> None:
    """No observer's leftovers in their database: the configured slot and publication (PostgreSQL)."""
    if db.mysql:
        return
    slot, publication = settings.LEGACY_OBSERVE_SLOT, settings.LEGACY_OBSERVE_PUBLICATION
    if db.sql("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [slot]):
        db.sql("SELECT pg_drop_replication_slot(%s)", [slot])
    db.sql(f"DROP PUBLICATION IF EXISTS {publication}")


# --- their workers on MySQL/MariaDB, as the example application writes its table (observe mode's tests) ----------


def mysql_claim(db: Their, job: str, worker: str, ttl: float) -> bool:
    db.sql(
        "UPDATE jobs SET locked_by = %s, locked_until = UTC_TIMESTAMP(6) + INTERVAL %s MICROSECOND "
        "WHERE job_id = %s AND (locked_until IS NULL OR locked_until < UTC_TIMESTAMP(6))",
        [worker, int(ttl * 1_000_000), job],
    )
    return db.sql("SELECT locked_by FROM jobs WHERE job_id = %s", [job])[0][0] == worker


def mysql_release(db: Their, job: str, worker: str) -> None:
    db.sql(
        "UPDATE jobs SET locked_by = NULL, locked_until = NULL WHERE job_id = %s AND locked_by = %s",
        [job, worker],
    )


def mysql_complete(db: Their, job: str, worker: str, output: dict) -> None:
    db.sql(
        "UPDATE jobs SET output = %s, finished_by = %s WHERE job_id = %s", [json.dumps(output), worker, job]
    )
