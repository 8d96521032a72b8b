"""The hot path's statements, written without the ORM's per-statement query compilation.

Why: a claim-next + stage + commit cycle is ~18 statements. Through QuerySets each costs ~0.3–0.5 ms of Python
to compile and materialise, ~3× the statement itself on this hardware, and at 16 workers on a 2-core box that
CPU is taken from PostgreSQL: the service path reached 0.19× the raw-SQL rate (docs/benchmarks.md). These
helpers keep Django's own value adaptation (``Field.get_db_prep_save``, so UUIDs, datetimes and JSON are stored
exactly as the ORM stores them on SQLite and PostgreSQL) and Django's raw-query model loading for reads, and
only skip the compiler. Statement text is cached per (model, columns).

Everything here runs inside the calling service's transaction; locks are named by the caller.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from django.db import connection, models


def is_postgres() -> bool:
    return connection.vendor == "postgresql"


def lock_clause(kind: str) -> str:
    """A row-lock clause on PostgreSQL; nothing on SQLite, where BEGIN IMMEDIATE already serialises writers."""
    return f" {kind}" if is_postgres() else ""


@cache
def _fields(model: type[models.Model]) -> dict[str, models.Field]:
    return {field.attname: field for field in model._meta.concrete_fields}


def prep(model: type[models.Model], attname: str, value: Any) -> Any:
    """``value`` as the database stores column ``attname`` (a UUID as hex on SQLite, JSON adapted, …)."""
    if value is None:
        return None
    return _fields(model)[attname].get_db_prep_save(value, connection)


@cache
def _insert_sql(model: type[models.Model], attnames: tuple[str, ...]) -> str:
    fields = _fields(model)
    columns = ", ".join(connection.ops.quote_name(fields[name].column) for name in attnames)
    return f"INSERT INTO {model._meta.db_table} ({columns}) VALUES ({', '.join(['%s'] * len(attnames))})"


def insert(model: type[models.Model], *, if_absent: bool = False, **values: Any) -> int:
    """One INSERT of one row; ``values`` by attname (``task_id``, not ``task``). With ``if_absent`` a row that
    would break a unique constraint is skipped (ON CONFLICT DO NOTHING). Returns the rows inserted."""
    sql = _insert_sql(model, tuple(values))
    if if_absent:
        sql += " ON CONFLICT DO NOTHING"
    with connection.cursor() as cursor:
        cursor.execute(sql, [prep(model, name, value) for name, value in values.items()])
        return cursor.rowcount


def _where(model: type[models.Model], where: dict[str, Any]) -> tuple[str, list[Any]]:
    fields = _fields(model)
    clauses, params = [], []
    for name, value in where.items():
        column = connection.ops.quote_name(fields[name].column)
        if value is None:
            clauses.append(f"{column} IS NULL")
        else:
            clauses.append(f"{column} = %s")
            params.append(prep(model, name, value))
    return " AND ".join(clauses), params


def update(model: type[models.Model], where: dict[str, Any], **values: Any) -> int:
    """UPDATE … SET values WHERE where (equalities; None means IS NULL). Returns the rows changed — the
    compare-and-set's answer: exactly one means we won."""
    fields = _fields(model)
    assignments = ", ".join(f"{connection.ops.quote_name(fields[name].column)} = %s" for name in values)
    condition, where_params = _where(model, where)
    sql = f"UPDATE {model._meta.db_table} SET {assignments} WHERE {condition}"
    with connection.cursor() as cursor:
        cursor.execute(sql, [prep(model, name, value) for name, value in values.items()] + where_params)
        return cursor.rowcount


def select(
    model: type[models.Model],
    where: dict[str, Any],
    *,
    also: str = "",
    also_params: list[Any] | None = None,
    tail: str = "",
    now: bool = False,
) -> list[models.Model]:
    """Rows as model instances (Django's raw-query loading converts every column). ``also`` is a further
    condition in SQL with its own (already adapted) params; ``tail`` is appended as is (ORDER BY, LIMIT, a lock
    clause)."""
    condition, params = _where(model, where)
    if now:
        # The database clock, read by the same statement (NULL on SQLite: the server's own clock is the database's).
        columns = "*, statement_timestamp() AS db_now" if is_postgres() else "*, NULL AS db_now"
    else:
        columns = "*"
    if also:
        condition = f"{condition} AND ({also})"
        params += also_params or []
    sql = f"SELECT {columns} FROM {model._meta.db_table} WHERE {condition}{tail}"
    return load(model, sql, params)


@cache
def _converters(
    model: type[models.Model], columns: tuple[str, ...], vendor: str
) -> tuple[list[str], list[Any]]:
    """For each result column: the attname it loads into and the database converters Django would apply
    (JSON decoding, UUIDs and datetimes from SQLite's text, …). Columns that are not fields are kept as
    attributes as they come (``db_now``)."""
    by_column = {field.column: field for field in model._meta.concrete_fields}
    names, converters = [], []
    for column in columns:
        field = by_column.get(column)
        if field is None:
            names.append(column)
            converters.append(None)
            continue
        expression = field.get_col(model._meta.db_table)
        chain = connection.ops.get_db_converters(expression) + field.get_db_converters(connection)
        names.append(field.attname)
        converters.append((expression, chain) if chain else None)
    return names, converters


def load(model: type[models.Model], sql: str, params: list[Any]) -> list[Any]:
    """Run ``sql`` (a SELECT, or a write with RETURNING *) and load its rows as ``model`` instances, with the
    conversions the ORM applies. What Model.objects.raw() does, minus its per-call setup."""
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        columns = tuple(col[0] for col in cursor.description)
        rows = cursor.fetchall()
    names, converters = _converters(model, columns, connection.vendor)
    field_names = {field.attname for field in model._meta.concrete_fields}
    loaded = []
    for row in rows:
        values = {}
        for name, value, conversion in zip(names, row, converters, strict=True):
            if conversion is not None:
                expression, chain = conversion
                for converter in chain:
                    value = converter(value, expression, connection)
            values[name] = value
        instance = model.from_db(
            connection.alias, None, [values[f.attname] for f in model._meta.concrete_fields]
        )
        for name in values.keys() - field_names:
            setattr(instance, name, values[name])
        loaded.append(instance)
    return loaded


def select_one(model: type[models.Model], where: dict[str, Any], **kwargs: Any) -> Any:
    rows = select(model, where, **kwargs)
    return rows[0] if rows else None


def placeholders(values: list[Any]) -> str:
    return ", ".join(["%s"] * len(values))
