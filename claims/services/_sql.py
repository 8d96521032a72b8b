"""The hot path's statements, written without the ORM's per-statement query compilation.

Why: a claim-next + stage + commit cycle is ~18 statements. Through QuerySets each costs ~0.3–0.5 ms of Python
to compile and materialise, ~3× the statement itself on this hardware, and at 16 workers on a 2-core box that
CPU is taken from PostgreSQL: the service path reached 0.19× the raw-SQL rate (docs/benchmarks.md). These
helpers keep Django's own value adaptation (``Field.get_db_prep_save``, so UUIDs, datetimes and JSON are stored
exactly as the ORM stores them on SQLite and PostgreSQL) and Django's column converters for reads, and only
skip the compiler. Statement text is cached per (model, columns, database).

Everything here runs inside the calling service's transaction; locks are named by the caller.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any
from uuid import UUID

from django.db import DEFAULT_DB_ALIAS, connections, models
from psycopg.types.datetime import TimestamptzLoader


def _db() -> Any:
    """The connection object itself: each attribute read through django.db.connection is a thread-local
    lookup, so a helper resolves it once and passes it on."""
    return connections[DEFAULT_DB_ALIAS]


def is_postgres() -> bool:
    return _db().vendor == "postgresql"


def lock_clause(kind: str) -> str:
    """A row-lock clause on PostgreSQL; nothing on SQLite, where BEGIN IMMEDIATE already serialises writers."""
    return f" {kind}" if is_postgres() else ""


@cache
def _fields(model: type[models.Model]) -> dict[str, models.Field]:
    return {field.attname: field for field in model._meta.concrete_fields}


@cache
def _as_is(model: type[models.Model], attname: str, vendor: str) -> frozenset[type]:
    """The Python types column ``attname`` takes as they are: text, numbers and booleans on both databases; on
    PostgreSQL also a UUID (a native uuid column) and an aware datetime (timestamptz) — what the field's own
    ``get_db_prep_save`` would hand back unchanged, without its per-value checks."""
    field = _fields(model)[attname]
    if isinstance(field, models.ForeignKey):
        field = field.target_field
    if isinstance(field, (models.CharField, models.TextField, models.IntegerField, models.BooleanField)):
        return frozenset((str, int, bool))
    if vendor == "postgresql" and isinstance(field, models.UUIDField):
        return frozenset((UUID,))
    if vendor == "postgresql" and isinstance(field, models.DateTimeField):
        return frozenset((datetime,))
    return frozenset()


def prep(model: type[models.Model], attname: str, value: Any, db: Any = None) -> Any:
    """``value`` as the database stores column ``attname`` (a UUID as hex on SQLite, JSON adapted, …)."""
    db = db or _db()
    if value is None or (
        type(value) in _as_is(model, attname, db.vendor)
        and (type(value) is not datetime or value.tzinfo is not None)  # a naive one gets Django's warning
    ):
        return value
    return _fields(model)[attname].get_db_prep_save(value, db)


@cache
def _column(model: type[models.Model], attname: str, vendor: str) -> str:
    return _db().ops.quote_name(_fields(model)[attname].column)


def column(model: type[models.Model], attname: str) -> str:
    """The column of ``model``'s field ``attname``, quoted for this database."""
    return _column(model, attname, _db().vendor)


@cache
def _insert_sql(model: type[models.Model], attnames: tuple[str, ...], vendor: str, if_absent: bool) -> str:
    columns = ", ".join(_column(model, name, vendor) for name in attnames)
    sql = f"INSERT INTO {model._meta.db_table} ({columns}) VALUES ({', '.join(['%s'] * len(attnames))})"
    return sql + " ON CONFLICT DO NOTHING" if if_absent else sql


class Statement(tuple):
    """``(sql, params)``. A plain one-row INSERT and an UPDATE by equalities also carry their ``shape`` (the
    table, the columns written, the columns matched): ``together`` sends many statements of one shape as one
    set-based statement over arrays, one array per column."""

    shape: tuple[Any, ...] | None = None

    def __new__(cls, sql: str, params: list[Any], shape: tuple[Any, ...] | None = None) -> Statement:
        statement = super().__new__(cls, (sql, params))
        statement.shape = shape
        return statement


def insert_statement(model: type[models.Model], *, if_absent: bool = False, **values: Any) -> Statement:
    """An INSERT of one row; ``values`` by attname (``task_id``, not ``task``). With ``if_absent`` a row that
    would break a unique constraint is skipped (ON CONFLICT DO NOTHING)."""
    db = _db()
    sql = _insert_sql(model, tuple(values), db.vendor, if_absent)
    shape = None if if_absent else ("insert", model, tuple(values))
    return Statement(sql, [prep(model, name, value, db) for name, value in values.items()], shape)


def insert_many_statement(model: type[models.Model], rows: list[dict[str, Any]]) -> Statement:
    """One INSERT of several rows (each by attname, all with the same columns), in the order given — on both
    databases an auto-increment key follows that order."""
    db = _db()
    attnames = tuple(rows[0])
    if db.vendor == "postgresql":
        columns = [[prep(model, name, row[name], db) for row in rows] for name in attnames]
        return Statement(_insert_arrays_sql(model, attnames), columns)
    one = _insert_sql(model, attnames, db.vendor, False)
    more = f", ({', '.join(['%s'] * len(attnames))})" * (len(rows) - 1)
    return Statement(one + more, [prep(model, name, row[name], db) for row in rows for name in attnames])


@cache
def _array_type(model: type[models.Model], attname: str) -> str:
    return f"{_fields(model)[attname].db_type(_db())}[]"


@cache
def _insert_arrays_sql(model: type[models.Model], attnames: tuple[str, ...]) -> str:
    """PostgreSQL: the rows as one array per column, unnested in order — a statement whose text does not grow
    with the rows (so it is parsed once, by psycopg and by PostgreSQL's plan cache alike)."""
    columns = ", ".join(_column(model, name, "postgresql") for name in attnames)
    arrays = ", ".join(f"%b::{_array_type(model, name)}" for name in attnames)
    return f"INSERT INTO {model._meta.db_table} ({columns}) SELECT * FROM unnest({arrays})"


@cache
def _update_arrays_sql(
    model: type[models.Model], attnames: tuple[str, ...], where: tuple[tuple[str, bool], ...]
) -> str:
    """PostgreSQL: UPDATEs of one shape as one, each row's values and keys an element of per-column arrays."""
    keys = [name for name, is_null in where if not is_null]
    names = [f"s{i}" for i in range(len(attnames))] + [f"k{i}" for i in range(len(keys))]
    arrays = ", ".join(f"%b::{_array_type(model, name)}" for name in [*attnames, *keys])
    table = model._meta.db_table
    assignments = ", ".join(
        f"{_column(model, name, 'postgresql')} = v.s{i}" for i, name in enumerate(attnames)
    )
    matches = [f"{table}.{_column(model, name, 'postgresql')} = v.k{i}" for i, name in enumerate(keys)]
    matches += [f"{table}.{_column(model, name, 'postgresql')} IS NULL" for name, is_null in where if is_null]
    return (
        f"UPDATE {table} SET {assignments} FROM unnest({arrays}) AS v({', '.join(names)}) "
        f"WHERE {' AND '.join(matches)}"
    )


def _set_based(shape: tuple[Any, ...], group: list[Statement]) -> Statement:
    """Statements of one shape (``Statement.shape``) as one, their params turned into per-column arrays."""
    width = len(group[0][1])
    columns = [[statement[1][i] for statement in group] for i in range(width)]
    if shape[0] == "insert":
        return Statement(_insert_arrays_sql(shape[1], shape[2]), columns)
    return Statement(_update_arrays_sql(shape[1], shape[2], shape[3]), columns)


def _coalesced(statements: tuple[Statement, ...]) -> list[Statement]:
    """On PostgreSQL, statements of one shape sent as one (in the place of the first of them); the others as they
    are. Only for writes that touch distinct rows, as every caller of ``together`` sends them."""
    groups: dict[Any, list[Statement]] = {}
    order: list[Any] = []
    for index, statement in enumerate(statements):
        shape = getattr(statement, "shape", None)
        key = shape if shape is not None else ("alone", index)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(statement)
    return [
        _set_based(key, groups[key]) if key[0] != "alone" and len(groups[key]) > 1 else groups[key][0]
        for key in order
    ]


@cache
def _upsert_sql(
    model: type[models.Model],
    attnames: tuple[str, ...],
    count: int,
    conflict: tuple[str, ...],
    update: tuple[str, ...],
    vendor: str,
) -> str:
    columns = ", ".join(_column(model, name, vendor) for name in attnames)
    row = f"({', '.join(['%s'] * len(attnames))})"
    target = ", ".join(_column(model, name, vendor) for name in conflict)
    assignments = ", ".join(
        f"{_column(model, name, vendor)} = EXCLUDED.{_column(model, name, vendor)}" for name in update
    )
    return (
        f"INSERT INTO {model._meta.db_table} ({columns}) VALUES {', '.join([row] * count)} "
        f"ON CONFLICT ({target}) DO UPDATE SET {assignments} RETURNING *"
    )


def upsert(
    model: type[models.Model],
    rows: list[dict[str, Any]],
    *,
    conflict: tuple[str, ...],
    update: tuple[str, ...],
) -> list[Any]:
    """Insert ``rows`` (each by attname, all with the same columns), except that a row that would break the unique
    constraint on ``conflict`` sets the existing row's ``update`` columns to its own instead; returns every row as
    it now stands, in no particular order. One statement on both databases."""
    db = _db()
    attnames = tuple(rows[0])
    if db.vendor == "postgresql" and len(rows) > 1:
        sql = _insert_arrays_sql(model, attnames) + _upsert_tail(model, conflict, update)
        return load(model, sql, [[prep(model, name, row[name], db) for row in rows] for name in attnames])
    sql = _upsert_sql(model, attnames, len(rows), conflict, update, db.vendor)
    return load(model, sql, [prep(model, name, row[name], db) for row in rows for name in attnames])


@cache
def _upsert_tail(model: type[models.Model], conflict: tuple[str, ...], update: tuple[str, ...]) -> str:
    target = ", ".join(_column(model, name, "postgresql") for name in conflict)
    assignments = ", ".join(
        f"{_column(model, name, 'postgresql')} = EXCLUDED.{_column(model, name, 'postgresql')}"
        for name in update
    )
    return f" ON CONFLICT ({target}) DO UPDATE SET {assignments} RETURNING *"


@cache
def _insert_select_sql(model: type[models.Model], attnames: tuple[str, ...], vendor: str) -> str:
    fields = _fields(model)
    columns = ", ".join(_column(model, name, vendor) for name in attnames)
    # Typed placeholders: in a SELECT list an untyped literal would resolve to text, not the column's type.
    values = ", ".join(f"%s::{fields[name].db_type(_db())}" for name in attnames)
    return f"INSERT INTO {model._meta.db_table} ({columns}) SELECT {values} FROM first"


def insert_if_absent_then(first: Statement, model: type[models.Model], **values: Any) -> bool:
    """Run ``first`` (an ``insert_statement(..., if_absent=True)``) and, only when it inserted its row, insert one
    ``model`` row — the event that records it. One statement on PostgreSQL (the second INSERT selects from the
    first's RETURNING); two on SQLite. Returns whether ``first`` inserted."""
    db = _db()
    first_sql, first_params = first
    then_params = [prep(model, name, value, db) for name, value in values.items()]
    with db.cursor() as cursor:
        if db.vendor != "postgresql":
            cursor.execute(first_sql, first_params)
            if cursor.rowcount != 1:
                return False
            cursor.execute(_insert_sql(model, tuple(values), db.vendor, False), then_params)
            return True
        sql = _insert_select_sql(model, tuple(values), db.vendor)
        cursor.execute(f"WITH first AS ({first_sql} RETURNING 1) {sql}", first_params + then_params)
        return cursor.rowcount == 1


_pending: ContextVar[list[Statement] | None] = ContextVar("claims_writes_together", default=None)


@contextmanager
def writes_together() -> Iterator[None]:
    """Inside it, ``write`` collects the writes; when the block ends without an exception they are sent as one
    round trip (``together``), still inside the caller's transaction. For a decision's writes once its reads are
    done: nothing inside may read what it wrote. Nested blocks send with the outermost."""
    if _pending.get() is not None:
        yield
        return
    pending: list[Statement] = []
    token = _pending.set(pending)
    try:
        yield
    finally:
        _pending.reset(token)
    if pending:
        together(*pending)


def write(*statements: Statement) -> None:
    """Writes whose row counts nobody needs: collected inside ``writes_together``, sent at once otherwise."""
    pending = _pending.get()
    if pending is not None:
        pending.extend(statements)
    else:
        together(*statements)


def together(*statements: Statement) -> None:
    """Run writes whose row counts nobody needs in one round trip. On PostgreSQL they become one statement, the
    first ones as data-modifying WITH clauses (each runs exactly once); SQLite runs them one by one."""
    db = _db()
    with db.cursor() as cursor:
        if db.vendor != "postgresql" or len(statements) == 1:
            for sql, params in statements:
                cursor.execute(sql, params)
            return
        *first, (last_sql, last_params) = _coalesced(statements)
        clauses = ", ".join(f"w{index} AS ({sql})" for index, (sql, _) in enumerate(first))
        params = [param for _, statement_params in first for param in statement_params]
        cursor.execute(f"WITH {clauses} {last_sql}", params + last_params)


@cache
def _where_sql(model: type[models.Model], shape: tuple[tuple[str, bool], ...], vendor: str) -> str:
    return " AND ".join(
        f"{_column(model, name, vendor)} IS NULL" if is_null else f"{_column(model, name, vendor)} = %s"
        for name, is_null in shape
    )


def _where(model: type[models.Model], where: dict[str, Any], db: Any) -> tuple[str, list[Any]]:
    shape = tuple((name, value is None) for name, value in where.items())
    params = [prep(model, name, value, db) for name, value in where.items() if value is not None]
    return _where_sql(model, shape, db.vendor), params


@cache
def _update_sql(model: type[models.Model], attnames: tuple[str, ...], condition: str, vendor: str) -> str:
    assignments = ", ".join(f"{_column(model, name, vendor)} = %s" for name in attnames)
    return f"UPDATE {model._meta.db_table} SET {assignments} WHERE {condition}"


def update_statement(model: type[models.Model], where: dict[str, Any], **values: Any) -> Statement:
    """UPDATE … SET values WHERE where (equalities; None means IS NULL)."""
    db = _db()
    condition, where_params = _where(model, where, db)
    sql = _update_sql(model, tuple(values), condition, db.vendor)
    shape = ("update", model, tuple(values), tuple((name, value is None) for name, value in where.items()))
    return Statement(
        sql, [prep(model, name, value, db) for name, value in values.items()] + where_params, shape
    )


def update(model: type[models.Model], where: dict[str, Any], **values: Any) -> int:
    """Run one UPDATE; returns the rows changed — the compare-and-set's answer: exactly one means we won."""
    sql, params = update_statement(model, where, **values)
    with _db().cursor() as cursor:
        cursor.execute(sql, params)
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
    """Rows as model instances, converted as the ORM converts them. ``also`` is a further condition in SQL
    with its own (already adapted) params; ``tail`` is appended as is (ORDER BY, LIMIT, a lock clause);
    ``now`` adds the database clock as ``db_now``."""
    db = _db()
    condition, params = _where(model, where, db)
    if now:
        # The database clock, read by the same statement (NULL on SQLite: the server's own clock is the database's).
        columns = "*, statement_timestamp() AS db_now" if db.vendor == "postgresql" else "*, NULL AS db_now"
    else:
        columns = "*"
    if also:
        condition = f"{condition} AND ({also})" if condition else f"({also})"
        params += also_params or []
    sql = f"SELECT {columns} FROM {model._meta.db_table} WHERE {condition}{tail}"
    return load(model, sql, params)


def select_one(model: type[models.Model], where: dict[str, Any], **kwargs: Any) -> Any:
    rows = select(model, where, **kwargs)
    return rows[0] if rows else None


def placeholders(values: list[Any]) -> str:
    return ", ".join(["%s"] * len(values))


@dataclass(frozen=True)
class _Plan:
    """How a statement's rows become ``model`` instances: the column holding each concrete field it returns (in the
    model's order, what Model.from_db takes) and, when it leaves some out, the attnames it returns (the others are
    deferred: read from the database if touched); the columns to convert with the database converters Django would
    apply (JSON decoding, UUIDs and datetimes from SQLite's text, …); and the columns that are not fields, kept as
    attributes as they come (``db_now``)."""

    fields: tuple[int, ...]
    field_names: tuple[str, ...] | None
    conversions: tuple[tuple[int, Any, tuple[Any, ...]], ...]
    extras: tuple[tuple[int, str], ...]


@cache
def _plan(model: type[models.Model], columns: tuple[str, ...], vendor: str) -> _Plan:
    position = {column: index for index, column in enumerate(columns)}
    by_column = {field.column: field for field in model._meta.concrete_fields}
    conversions = []
    for column, index in position.items():
        field = by_column.get(column)
        if field is None:
            continue
        expression = field.get_col(model._meta.db_table)
        # Field.get_db_converters is Django's (used by its own compiler) but missing from django-stubs.
        chain = _db().ops.get_db_converters(expression) + field.get_db_converters(_db())  # type: ignore[attr-defined]
        if chain:
            conversions.append((index, expression, tuple(chain)))
    returned = [field for field in model._meta.concrete_fields if field.column in position]
    return _Plan(
        fields=tuple(position[field.column] for field in returned),
        field_names=None
        if len(returned) == len(model._meta.concrete_fields)
        else tuple(field.attname for field in returned),
        conversions=tuple(conversions),
        extras=tuple((index, column) for column, index in position.items() if column not in by_column),
    )


_COLUMNS: dict[tuple[str, str], tuple[str, ...]] = {}


def _timestamps_in_c(cursor: Any, db: Any) -> None:
    """This cursor's timestamps read by psycopg's own loader (C, with psycopg[binary]) instead of Django's, which
    is Python and only gives each value the connection's time zone: the same values, UTC both ways — where Django's
    connection and the session both say UTC (Django sets the session's TimeZone to its own). Django's loader was a
    fifth of the time the worker path spent loading rows (docs/benchmarks.md, "The batched bar")."""
    if db.timezone is UTC and cursor.connection.info.timezone is UTC:
        cursor.adapters.register_loader("timestamptz", TimestamptzLoader)


def load(model: type[models.Model], sql: str, params: list[Any]) -> list[Any]:
    """Run ``sql`` (a SELECT, or a write with RETURNING *) and load its rows as ``model`` instances, with the
    conversions the ORM applies. What Model.objects.raw() does, minus its per-call setup."""
    db = _db()
    with db.cursor() as cursor:
        if db.vendor == "postgresql":
            _timestamps_in_c(cursor.cursor, db)
        cursor.execute(sql, params)
        # A statement's text fixes its columns; reading cursor.description builds objects per column per call.
        key = (db.vendor, sql)
        columns = _COLUMNS.get(key)
        if columns is None:
            columns = _COLUMNS[key] = tuple(col[0] for col in cursor.description)
        rows = cursor.fetchall()
        if rows and len(rows[0]) != len(columns):  # a migration changed a ``t.*``'s table: read them again
            columns = _COLUMNS[key] = tuple(col[0] for col in cursor.description)
    plan = _plan(model, columns, db.vendor)
    loaded = []
    for fetched in rows:
        row = list(fetched)
        for index, expression, chain in plan.conversions:
            value = row[index]
            for converter in chain:
                value = converter(value, expression, db)
            row[index] = value
        # field_names=None means "every concrete field, in order" (Model.from_db); the stubs want a collection.
        instance = model.from_db(db.alias, plan.field_names, [row[index] for index in plan.fields])  # type: ignore[arg-type]
        for index, name in plan.extras:
            setattr(instance, name, row[index])
        loaded.append(instance)
    return loaded
