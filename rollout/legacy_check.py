"""The pre-flight of a legacy table mapping (``manage.py legacy_check``): read-only questions to the team's database,
each answered "ok" or with what to change. With ``observe``, the change stream's pre-flight too
(``stream_check``: wal_level, REPLICATION, replica identity, the publication's columns, the slot)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connections, transaction

from .legacy_table import TableLegacyStore, TableMapping, configured_mapping
from .stream_check import check_stream

_TEXT = ("char", "text", "string")
_TIME = ("timestamp", "datetime")


@dataclass
class Report:
    table: str
    passed: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    rows: int = 0

    def expect(self, holds: bool, ok: str, fix: str) -> bool:
        (self.passed if holds else self.problems).append(ok if holds else fix)
        return holds


def check(text: str | None = None, *, observe: bool = False) -> Report:
    """The mapping against the live table; ``observe``: the change stream's pre-flight too (stream_check)."""
    mapping = TableMapping.parse(text) if text is not None else configured_mapping()
    report = Report(mapping.table)
    if not report.expect(
        mapping.database in settings.DATABASES,
        f"database alias {mapping.database!r} is configured",
        f"no database {mapping.database!r}: set LEGACY_DATABASE_URL (postgres://… or mysql://…)",
    ):
        return report
    connection = connections[mapping.database]
    try:
        connection.ensure_connection()
    except DatabaseError as exc:
        report.problems.append(f"cannot connect to the legacy database: {exc}")
        return report
    report.passed.append(f"connected ({connection.vendor})")
    columns = table_columns(connection, mapping)
    if not report.expect(
        columns is not None,
        f"table {mapping.table} exists",
        f"no table {mapping.table} in the legacy database (check 'table', and the schema: schema.table)",
    ):
        return report
    assert columns is not None
    for role, name, kinds in _roles(mapping):
        if not report.expect(
            name in columns,
            f"{role} column {name} exists",
            f"{role}: no column {name} in {mapping.table} (columns: {', '.join(sorted(columns))})",
        ):
            continue
        type_name, nullable = columns[name]
        if kinds:
            report.expect(
                any(kind in type_name for kind in kinds),
                f"{role} column {name} is {type_name}",
                f"{role} column {name} is {type_name}; it must be one of: {', '.join(kinds)}",
            )
        if role == "expires":
            report.expect(
                nullable,
                f"{name} may be NULL (a release clears it)",
                f"{name} is NOT NULL, but a release clears the expiry: ALTER it to allow NULL",
            )
        if role == "owner" and mapping.released_owner == "null":
            report.expect(
                nullable,
                f"{name} may be NULL (a release clears it: released_owner null)",
                f'{name} is NOT NULL, but a release leaves it NULL: ALTER it to allow NULL, or say "released_owner": '
                "\"empty\" in the mapping if your workers pick rows whose owner is ''",
            )
    report.expect(
        _unique(connection, mapping),
        f"key {mapping.key} is unique",
        f"key {mapping.key} is neither the primary key nor unique: map the column that identifies a task",
    )
    if not report.problems:  # a read of columns that are not there would only fail for the same reason
        _rights(report, mapping)
    if mapping.namespace_map and not report.problems:
        _unmapped(report, mapping)
    if observe:
        check_stream(report, mapping, connection, columns)
    return report


def _unmapped(report: Report, mapping: TableMapping) -> None:
    """Values of namespace_column the map does not name: their rows belong to no namespace (never imported, never
    judged) — said, so that a value spelled differently in the map is not a silent gap."""
    store = TableLegacyStore(mapping)
    column, table = store.quote(mapping.namespace_column), store.quote(mapping.table)
    with connections[mapping.database].cursor() as cursor:
        cursor.execute(f"SELECT DISTINCT {column} FROM {table} LIMIT 1000")
        values = {str(value) for (value,) in cursor.fetchall() if value is not None}
    missing = sorted(values - set(mapping.namespace_map))
    report.expect(
        not missing,
        f"namespace_map names every {mapping.namespace_column} value in the table",
        f"namespace_map does not name {mapping.namespace_column} values {', '.join(missing[:10])}: their rows are of "
        "no namespace (never imported, never judged) — add them to the map if they are work to migrate",
    )


def _roles(mapping: TableMapping) -> list[tuple[str, str, tuple[str, ...]]]:
    roles = [("key", mapping.key, ()), ("owner", mapping.owner, _TEXT), ("expires", mapping.expires, _TIME)]
    if mapping.result:
        roles.append(("result", mapping.result, ("json", *_TEXT)))
    if mapping.completed:
        kinds = {"owner": _TEXT, "true": ("bool", "tinyint"), "now": _TIME}[mapping.completed_as]
        roles.append(("completed", mapping.completed, kinds))
    if mapping.namespace_column:
        roles.append(("namespace_column", mapping.namespace_column, _TEXT))
    if mapping.input:
        roles.append(("input", mapping.input, ("json", *_TEXT)))
    if mapping.version:
        roles.append(("version", mapping.version, ("int",)))
    if mapping.updated_at:
        roles.append(("updated_at", mapping.updated_at, _TIME))
    return roles


def table_columns(connection: Any, mapping: TableMapping) -> dict[str, tuple[str, bool]] | None:
    """The table's columns: name → (type as the database names it, lowercased; nullable)."""
    schema, _, table = mapping.table.rpartition(".")
    if connection.vendor == "postgresql":
        sql = (
            "SELECT column_name, data_type, is_nullable = 'YES' FROM information_schema.columns "
            "WHERE table_name = %s AND table_schema = COALESCE(NULLIF(%s, ''), current_schema())"
        )
    else:
        sql = (
            "SELECT column_name, column_type, is_nullable = 'YES' FROM information_schema.columns "
            "WHERE table_name = %s AND table_schema = COALESCE(NULLIF(%s, ''), DATABASE())"
        )
    with connection.cursor() as cursor:
        cursor.execute(sql, [table, schema])
        rows = cursor.fetchall()
    return {name: (str(kind).lower(), bool(nullable)) for name, kind, nullable in rows} or None


def _unique(connection: Any, mapping: TableMapping) -> bool:
    table = mapping.table.rpartition(".")[2]
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
    return any(
        info["columns"] == [mapping.key] and (info["primary_key"] or info["unique"])
        for info in constraints.values()
    )


def _rights(report: Report, mapping: TableMapping) -> None:
    """A sample read, and an UPDATE that matches no row inside a transaction rolled back: the rights the adapter
    uses, proved by using them on nothing."""
    store = TableLegacyStore(mapping)
    try:
        rows = store.sample(5)
    except DatabaseError as exc:
        report.problems.append(f"cannot read {mapping.table}: {exc} (GRANT SELECT on it)")
        return
    report.rows = len(rows)
    report.passed.append(f"read {len(rows)} sample rows")
    q = store.quote
    try:
        with transaction.atomic(using=mapping.database):
            with connections[mapping.database].cursor() as cursor:
                cursor.execute(f"SELECT {q(mapping.key)} FROM {q(mapping.table)} WHERE 1 = 0 FOR UPDATE")
                cursor.execute(
                    f"UPDATE {q(mapping.table)} SET {q(mapping.owner)} = {q(mapping.owner)} WHERE 1 = 0"
                )
            transaction.set_rollback(True, using=mapping.database)
    except DatabaseError as exc:
        report.problems.append(f"cannot lock and update {mapping.table}: {exc} (GRANT UPDATE on it)")
        return
    report.passed.append("may lock rows (FOR UPDATE) and UPDATE them")
