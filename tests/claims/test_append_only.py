"""The append-only records are append-only in the database itself, on every backend the project supports, after
the last migration (issue 38: 0017 rebuilt the timeline's table on SQLite and dropped its guard — the embedded
default let a timeline row be rewritten, and nothing in CI ran SQLite). The guard is each table's trigger; the
guarantee per backend is 0023's: PostgreSQL refuses UPDATE and DELETE, SQLite refuses UPDATE (its test runner
empties tables with DELETE)."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction

pytestmark = pytest.mark.django_db

APPEND_ONLY = ("claims_taskevent", "claims_auditentry", "claims_effectevent")


def _guards(table: str) -> list[str]:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal AND tgenabled <> 'D'",
                [table],
            )
        else:
            cursor.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = %s", [table])
        return [name for (name,) in cursor.fetchall()]


@pytest.fixture
def one_row_in_each(operator, worker_a, ready_task):
    """A timeline row, an audit entry and an effect's history row, each written the product's way."""
    claim = worker_a.claim(ready_task, ttl=30).json()
    assert worker_a.prepare(claim, "notify", {"to": "ops"}).status_code == 201
    assert (
        operator.post(f"/tasks/{ready_task}/cancel", {"reason": "to have an audit entry"}).status_code == 200
    )
    with connection.cursor() as cursor:
        for table in APPEND_ONLY:
            cursor.execute(f"SELECT count(*) FROM {table}")
            assert cursor.fetchone()[0] > 0, table


@pytest.mark.parametrize("table", APPEND_ONLY)
def test_each_append_only_table_has_its_guard_after_the_last_migration(table):
    assert _guards(table) == [f"{table}_append_only"]


@pytest.mark.parametrize("table", APPEND_ONLY)
def test_an_update_of_an_append_only_row_is_refused(table, one_row_in_each):
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT principal FROM {table} ORDER BY id")
        before = cursor.fetchall()
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            cursor.execute(f"UPDATE {table} SET principal = 'someone-else'")  # no other constraint is met
        cursor.execute(f"SELECT principal FROM {table} ORDER BY id")
        assert cursor.fetchall() == before


@pytest.mark.parametrize("table", APPEND_ONLY)
def test_a_delete_of_an_append_only_row_is_refused_where_the_backend_guards_deletes(table, one_row_in_each):
    if connection.vendor != "postgresql":
        pytest.skip(
            "SQLite's guard refuses UPDATE only: its test runner empties tables with DELETE (0004, 0023)"
        )
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT count(*) FROM {table}")
        before = cursor.fetchone()[0]
        with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
            cursor.execute(f"DELETE FROM {table}")
        cursor.execute(f"SELECT count(*) FROM {table}")
        assert cursor.fetchone()[0] == before
