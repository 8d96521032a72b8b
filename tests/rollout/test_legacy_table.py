"""The legacy table adapter (rollout.legacy_table) over a team's own table in its own database — a second PostgreSQL
database (the ``legacy`` alias) and MariaDB (``legacy_mysql``, where LEGACY_MYSQL_URL is set, as .ci/run sets it):
their column names, their rows, the emulated table's semantics, decided on the row as locked with the legacy
database's clock read after the lock, and nothing written outside the mapped columns."""

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
from rollout.legacy_table import TableMapping
from tests.support.legacy_db import ALIASES, MAPPING, row, wait_for_a_lock_waiter
from tests.support.races import Pause, run_in_thread

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", *ALIASES]),
    pytest.mark.skipif(
        not ALIASES, reason="no legacy database configured (the suite's PostgreSQL run adds one)"
    ),
]


def test_claim_heartbeat_release_and_complete_write_their_columns(their, jobs):
    granted = jobs.claim(task_id="j1", namespace="default", owner_id="w1", ttl_seconds=60)
    held = jobs.claim(task_id="j1", namespace="default", owner_id="w2", ttl_seconds=60)
    renewed = jobs.heartbeat(task_id="j1", owner_id="w1", ttl_seconds=120)
    not_owner = jobs.release(task_id="j1", owner_id="w2")

    words = (granted.word, held.word, renewed.word, not_owner.word)
    assert words == ("GRANTED", "HELD", "RENEWED", "NOT_OWNER")
    owner, until, _, _, payload = row(their, "j1")
    assert owner == "w1" and until == renewed.expires_at and payload == "p1"
    assert renewed.expires_at - renewed.at == timedelta(seconds=120)

    assert jobs.release(task_id="j1", owner_id="w1").word == "RELEASED"
    assert row(their, "j1")[:2] == (None, None)  # NULL, as their pick query (locked_by IS NULL) expects

    done = jobs.complete(task_id="j1", namespace="default", owner_id="w9", result={"r": 1}, result_digest="d")
    assert done.word == "COMPLETED"  # unconditional: last write wins, as the legacy table does
    assert row(their, "j1")[2:] == ({"r": 1}, "w9", "p1")


def test_a_claim_after_expiry_is_a_takeover(their, jobs):
    their.sql(f"UPDATE jobs SET locked_by = 'w1', locked_until = {their.plus(-1)} WHERE job_id = 'j2'")

    verdict = jobs.claim(task_id="j2", namespace="default", owner_id="w2", ttl_seconds=30)

    assert verdict.word == "GRANTED" and row(their, "j2")[0] == "w2"


def test_a_task_not_in_their_table_or_of_another_queue_is_missing_and_nothing_is_inserted(their, jobs):
    absent = jobs.claim(task_id="nope", namespace="default", owner_id="w1", ttl_seconds=30)
    elsewhere = jobs.claim(task_id="j3", namespace="default", owner_id="w1", ttl_seconds=30)

    assert (absent.word, absent.accepted, elsewhere.word) == ("MISSING", False, "MISSING")
    assert their.sql("SELECT count(*) FROM jobs") == [(3,)]
    assert row(their, "j3")[0] is None


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


def test_a_batch_is_decided_in_one_transaction_in_key_order(their, jobs):
    verdicts = jobs.decide_many(
        [
            LegacyAsk("claim", {"task_id": "j2", "namespace": "default", "owner_id": "w", "ttl_seconds": 30}),
            LegacyAsk("claim", {"task_id": "j1", "namespace": "default", "owner_id": "w", "ttl_seconds": 30}),
        ]
    )

    assert [v.word for v in verdicts] == ["GRANTED", "GRANTED"]
    assert verdicts[0].at == verdicts[1].at  # one clock, read once after both rows' locks
    assert row(their, "j1")[0] == row(their, "j2")[0] == "w"


def test_the_decision_is_made_on_the_row_as_locked_with_the_clock_read_after_the_lock(their, jobs):
    """A legacy worker holds j1's row (its own transaction: owned by w1 until one second from now) while the
    adapter is asked to claim j1 for w2. The adapter waits for the row; by the time it has the lock w1's expiry
    has passed, so the clock read after the lock says takeover. Read before the lock, the clock would have said
    HELD — the test fails that way."""
    holder = connections.create_connection(their.alias)
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute(
                f"UPDATE jobs SET locked_by = 'w1', locked_until = {their.plus(1)} WHERE job_id = 'j1'"
            )
        thread, box = run_in_thread(
            lambda: jobs.claim(task_id="j1", namespace="default", owner_id="w2", ttl_seconds=30)
        )
        wait_for_a_lock_waiter(their)
        time.sleep(1.5)  # w1's expiry passes while the adapter waits for the row
        holder.commit()
        thread.join(20)
    finally:
        holder.close()

    assert box["value"].word == "GRANTED", box
    assert row(their, "j1")[0] == "w2"


def test_a_second_decision_waits_for_the_first_and_sees_its_write(their, jobs):
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
    wait_for_a_lock_waiter(their)
    pause.resume()
    first.join(20)
    second.join(20)

    assert (first_box["value"].word, second_box["value"].word) == ("GRANTED", "HELD")
    assert row(their, "j1")[0] == "w1"


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


def test_legacy_check_passes_a_fitting_mapping_and_says_what_to_fix_otherwise(their, jobs, capsys):
    call_command("legacy_check", mapping=json.dumps({**MAPPING, "database": their.alias}))
    passed = capsys.readouterr().out

    wrong = {**MAPPING, "database": their.alias, "owner": "owner_id", "expires": "payload"}
    with pytest.raises(CommandError, match="3 to fix"):
        call_command("legacy_check", mapping=json.dumps(wrong))
    fixes = capsys.readouterr().out

    assert "the mapping fits jobs (3 rows sampled)" in passed
    assert "FIX   owner: no column owner_id in jobs" in fixes
    assert "FIX   expires column payload is text; it must be one of: timestamp, datetime" in fixes
    assert "FIX   payload is NOT NULL, but a release clears the expiry: ALTER it to allow NULL" in fixes
    assert their.sql("SELECT count(*) FROM jobs WHERE locked_by IS NOT NULL") == [
        (0,)
    ]  # the check changed nothing


def test_none_of_our_tables_is_created_in_their_database(their, jobs):
    tables = their.tables()

    assert "jobs" in tables
    assert not {
        t for t in tables if t.startswith(("claims_", "rollout_", "oncall_", "auth_", "django_session"))
    }
