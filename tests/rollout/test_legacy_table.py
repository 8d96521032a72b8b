"""The legacy table adapter (rollout.legacy_table) over a team's own table in its own PostgreSQL database (the
``legacy`` alias): their column names, their rows, the emulated table's semantics, decided on the row as locked
with the legacy database's clock read after the lock, and nothing written outside the mapped columns."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connections

from rollout.legacy import LegacyAsk
from rollout.legacy_table import TableLegacyStore, TableMapping
from tests.support.races import Pause, run_in_thread

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "legacy"]),
    pytest.mark.skipif(
        "legacy" not in connections, reason="no legacy database configured (LEGACY_DATABASE_URL)"
    ),
]

MAPPING = {
    "table": "jobs",
    "key": "job_id",
    "owner": "locked_by",
    "expires": "locked_until",
    "result": "output",
    "completed": "finished_by",
    "namespace_column": "queue",
}


def sql(statement: str, params: list | None = None) -> list[tuple]:
    with connections["legacy"].cursor() as cursor:
        cursor.execute(statement, params or [])
        return cursor.fetchall() if cursor.description else []


@pytest.fixture
def jobs():
    """The team's table: its own names, a column the adapter must never touch (payload), three jobs."""
    sql("DROP TABLE IF EXISTS jobs")
    sql(
        "CREATE TABLE jobs (job_id varchar(64) PRIMARY KEY, queue text NOT NULL, payload text NOT NULL, "
        "locked_by text, locked_until timestamptz, output jsonb, finished_by text)"
    )
    sql(
        "INSERT INTO jobs (job_id, queue, payload) VALUES ('j1', 'default', 'p1'), ('j2', 'default', 'p2'), "
        "('j3', 'other', 'p3')"
    )
    yield TableLegacyStore(TableMapping(**MAPPING))
    sql("DROP TABLE IF EXISTS jobs")


def row(job_id: str) -> tuple:
    return sql(
        "SELECT locked_by, locked_until, output, finished_by, payload FROM jobs WHERE job_id = %s", [job_id]
    )[0]


def test_claim_heartbeat_release_and_complete_write_their_columns(jobs):
    granted = jobs.claim(task_id="j1", namespace="default", owner_id="w1", ttl_seconds=60)
    held = jobs.claim(task_id="j1", namespace="default", owner_id="w2", ttl_seconds=60)
    renewed = jobs.heartbeat(task_id="j1", owner_id="w1", ttl_seconds=120)
    not_owner = jobs.release(task_id="j1", owner_id="w2")

    assert (granted.word, held.word, renewed.word, not_owner.word) == (
        "GRANTED",
        "HELD",
        "RENEWED",
        "NOT_OWNER",
    )
    owner, until, _, _, payload = row("j1")
    assert owner == "w1" and until == renewed.expires_at and payload == "p1"
    assert renewed.expires_at - renewed.at == timedelta(seconds=120)

    assert jobs.release(task_id="j1", owner_id="w1").word == "RELEASED"
    assert row("j1")[:2] == ("", None)

    done = jobs.complete(task_id="j1", namespace="default", owner_id="w9", result={"r": 1}, result_digest="d")
    assert done.word == "COMPLETED"  # unconditional: last write wins, as the legacy table does
    output, finished_by, payload = row("j1")[2:]
    assert (json.loads(output), finished_by, payload) == ({"r": 1}, "w9", "p1")


def test_a_claim_after_expiry_is_a_takeover(jobs):
    sql("UPDATE jobs SET locked_by = 'w1', locked_until = now() - interval '1 second' WHERE job_id = 'j2'")

    verdict = jobs.claim(task_id="j2", namespace="default", owner_id="w2", ttl_seconds=30)

    assert verdict.word == "GRANTED" and row("j2")[0] == "w2"


def test_a_task_not_in_their_table_or_of_another_queue_is_missing_and_nothing_is_inserted(jobs):
    absent = jobs.claim(task_id="nope", namespace="default", owner_id="w1", ttl_seconds=30)
    elsewhere = jobs.claim(task_id="j3", namespace="default", owner_id="w1", ttl_seconds=30)

    assert (absent.word, absent.accepted, elsewhere.word) == ("MISSING", False, "MISSING")
    assert sql("SELECT count(*) FROM jobs") == [(3,)]
    assert row("j3")[0] is None


def test_reads_see_their_rows_as_legacy_claims(jobs):
    jobs.claim(task_id="j1", namespace="default", owner_id="w1", ttl_seconds=60)
    jobs.claim(task_id="j3", namespace="other", owner_id="w3", ttl_seconds=60)
    jobs.complete(task_id="j2", namespace="default", owner_id="w2", result={"r": 2}, result_digest="d")
    now = jobs._clock()

    live = jobs.live_claims(namespace="default", now=now)
    one = jobs.get(task_id="j2")

    assert [(c.task_id, c.owner_id, c.namespace) for c in live] == [("j1", "w1", "default")]
    assert (one.completed_by, one.result, one.namespace) == ("w2", {"r": 2}, "default")
    assert jobs.live_claims(namespace="default", now=now, pool="gpu") == []


def test_a_batch_is_decided_in_one_transaction_in_key_order(jobs):
    verdicts = jobs.decide_many(
        [
            LegacyAsk("claim", {"task_id": "j2", "namespace": "default", "owner_id": "w", "ttl_seconds": 30}),
            LegacyAsk("claim", {"task_id": "j1", "namespace": "default", "owner_id": "w", "ttl_seconds": 30}),
        ]
    )

    assert [v.word for v in verdicts] == ["GRANTED", "GRANTED"]
    assert verdicts[0].at == verdicts[1].at  # one clock, read once after both rows' locks
    assert row("j1")[0] == row("j2")[0] == "w"


def test_the_decision_is_made_on_the_row_as_locked_with_the_clock_read_after_the_lock(jobs):
    """A legacy worker holds j1's row (its own transaction: owned by w1 until one second from now) while the
    adapter is asked to claim j1 for w2. The adapter waits for the row; by the time it has the lock w1's expiry
    has passed, so the clock read after the lock says takeover. Read before the lock, the clock would have said
    HELD — the test fails that way."""
    holder = connections.create_connection("legacy")
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute(
                "UPDATE jobs SET locked_by = 'w1', locked_until = clock_timestamp() + interval '1 second' "
                "WHERE job_id = 'j1'"
            )
        thread, box = run_in_thread(
            lambda: jobs.claim(task_id="j1", namespace="default", owner_id="w2", ttl_seconds=30)
        )
        _wait_for_a_lock_waiter()
        time.sleep(1.5)  # w1's expiry passes while the adapter waits for the row
        holder.commit()
        thread.join(20)
    finally:
        holder.close()

    assert box["value"].word == "GRANTED", box
    assert row("j1")[0] == "w2"


def _wait_for_a_lock_waiter(timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        waiting = sql(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )[0][0]
        if waiting:
            return
        time.sleep(0.02)
    raise AssertionError("the adapter never waited for the row")


def test_a_second_decision_waits_for_the_first_and_sees_its_write(jobs):
    """Two claims of one row at once: the second decides on the row the first wrote (HELD), never on the row
    as it was before the first committed."""
    pause = Pause("legacy_table.decided")
    first, first_box = run_in_thread(
        lambda: jobs.claim(task_id="j1", namespace="default", owner_id="w1", ttl_seconds=60)
    )
    pause.wait_reached()
    second, second_box = run_in_thread(
        lambda: jobs.claim(task_id="j1", namespace="default", owner_id="w2", ttl_seconds=60)
    )
    _wait_for_a_lock_waiter()
    pause.resume()
    first.join(20)
    second.join(20)

    assert (first_box["value"].word, second_box["value"].word) == ("GRANTED", "HELD")
    assert row("j1")[0] == "w1"


@pytest.mark.parametrize(
    ("mapping", "says"),
    [
        ("", "is empty"),
        ("{not json", "is not JSON"),
        ('{"table": "jobs"}', "key, owner, expires missing"),
        (json.dumps({**MAPPING, "owner": "x; drop table jobs"}), "owner must name a column"),
        (json.dumps({**MAPPING, "colour": "red"}), "unknown keys colour"),
        (json.dumps({**MAPPING, "completed_as": "maybe"}), "completed_as must be one of"),
        ("/no/such/mapping.json", "names no file"),
    ],
)
def test_a_bad_mapping_is_refused_with_what_to_change(mapping, says):
    with pytest.raises(ImproperlyConfigured, match=says):
        TableMapping.parse(mapping)


def test_legacy_check_passes_a_fitting_mapping_and_says_what_to_fix_otherwise(jobs, capsys):
    call_command("legacy_check", mapping=json.dumps(MAPPING))
    passed = capsys.readouterr().out

    wrong = {**MAPPING, "owner": "owner_id", "expires": "payload"}
    with pytest.raises(CommandError, match="3 to fix"):
        call_command("legacy_check", mapping=json.dumps(wrong))
    fixes = capsys.readouterr().out

    assert "the mapping fits jobs (3 rows sampled)" in passed
    assert "FIX   owner: no column owner_id in jobs" in fixes
    assert "FIX   expires column payload is text; it must be one of: timestamp, datetime" in fixes
    assert "FIX   payload is NOT NULL, but a release clears the expiry: ALTER it to allow NULL" in fixes
    assert sql("SELECT count(*) FROM jobs WHERE locked_by IS NOT NULL") == [(0,)]  # the check changed nothing


def test_none_of_our_tables_is_created_in_their_database(jobs):
    tables = {name for (name,) in sql("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")}

    assert "jobs" in tables
    assert not {
        t for t in tables if t.startswith(("claims_", "rollout_", "oncall_", "auth_", "django_session"))
    }
