"""A legacy claim table a team already has, in its own database: configured, not coded (docs/adopting.md).

    LEGACY_DATABASE_URL=postgres://…/theirs        (or mysql://…; the Django alias ``legacy``)
    ROLLOUT_LEGACY_STORE=rollout.legacy_table.TableLegacyStore
    ROLLOUT_LEGACY_TABLE='{"table": "jobs", "key": "job_id", "owner": "locked_by", "expires": "locked_until",
                           "result": "output", "completed": "finished_by", "namespace": "default"}'

``ROLLOUT_LEGACY_TABLE`` is the mapping, as JSON or the path of a JSON file: the table, its key column (the task
id), owner and expiry columns, optionally a result column and a completed column (``completed_as``: ``owner`` writes
the owner's id, ``true`` a boolean, ``now`` the legacy database's clock), and the namespace — ``namespace`` (every row
is of that one) or ``namespace_column``. ``manage.py legacy_check`` checks it against the live table.

The semantics are the emulated table's (``rollout.legacy``): owner + expiry, after expiry anyone takes over, a
heartbeat or release by the named owner, ``complete`` unconditional (last write wins). Two differences, both so that
the control plane makes no surprise writes to the team's database: a task whose row does not exist is ``MISSING``
(the team's table is the list of tasks; the store never inserts), and only the mapped columns are written.

Each decision is a transaction of the legacy database's own: the rows FOR UPDATE in key order, then that database's
clock (the one its own workers' ``expires_at < now()`` reads), then the writes. Inside a decision of ours
(``rollout.legacy.legacy_unit``) it stays open until ours ends and commits after it (or rolls back with it), each
write recorded in ours first (``LegacyDecision``); elsewhere it commits at once. docs/adopting.md, "Two databases".
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.db import connection, connections, transaction
from django.db.models.functions import Now

from claims import interleave
from claims.digest import canonical_json, digest

from .legacy import _DECIDE, BatchOfOne, LegacyAsk, LegacyVerdict, current_unit
from .legacy_mapping import COMPLETED_AS, TableMapping, configured_mapping  # noqa: F401 - the mapping, as before
from .models import LegacyClaim, LegacyDecision


class TableLegacyStore(BatchOfOne):
    """``rollout.legacy.LegacyStore`` over the mapped table (see the module's docstring)."""

    separate_database = True

    def __init__(self, mapping: TableMapping | None = None):
        self.mapping = mapping or configured_mapping()

    # --- the LegacyStore methods (claim, heartbeat, release, complete, record_claim: BatchOfOne's) --------------

    def get(self, *, task_id) -> LegacyClaim | None:
        rows = self._select(f"{self._q(self.mapping.key)} = %s", [task_id])
        return rows[0] if rows else None

    def get_many(self, *, task_ids: list[str]) -> dict[str, LegacyClaim]:
        if not task_ids:
            return {}
        marks = ", ".join(["%s"] * len(task_ids))
        return {
            row.task_id: row for row in self._select(f"{self._q(self.mapping.key)} IN ({marks})", task_ids)
        }

    def live_claims(self, *, namespace, now, pool=None) -> list[LegacyClaim]:
        if pool:  # the table has no pool column: every claim in it is of the default pool ("")
            return []
        m = self.mapping
        where, params = (
            f"{self._q(m.owner)} IS NOT NULL AND {self._q(m.owner)} <> '' AND {self._q(m.expires)} > %s",
            [self._db_value(now)],
        )
        if m.completed:
            where += f" AND {self._incomplete()}"
        scope, scoped = self._of_namespace(namespace)
        if scope is None:
            return []
        return self._select(f"{where} AND {scope}", params + scoped)

    def _of_namespace(self, namespace: str) -> tuple[str | None, list[Any]]:
        """SQL that picks the rows of ``namespace`` (None: the table has none of it), and its parameters."""
        m = self.mapping
        if not m.namespace_column:
            return ("1 = 1", []) if namespace == m.namespace else (None, [])
        raws = m.raw_values(namespace)
        if not raws:
            return None, []
        return f"{self._q(m.namespace_column)} IN ({', '.join(['%s'] * len(raws))})", raws

    def rows_after(self, *, namespace: str, key: str | None, limit: int) -> list[tuple[str, Any]]:
        """The import's read: up to ``limit`` rows of ``namespace`` past ``key`` in key order, as ``(task_id,
        input)`` — the input read from the mapping's ``input`` column (JSON where it parses), else None."""
        m, q = self.mapping, self._q
        scope, params = self._of_namespace(namespace)
        if scope is None:
            return []
        where = scope
        if key is not None:
            where += f" AND {q(m.key)} > %s"
            params = [*params, key]
        source = q(m.input) if m.input else "NULL"
        with connections[m.database].cursor() as cursor:
            cursor.execute(
                f"SELECT {q(m.key)}, {source} FROM {q(m.table)} WHERE {where} ORDER BY {q(m.key)} LIMIT {int(limit)}",
                params,
            )
            return [(str(task_id), json_value(value)) for task_id, value in cursor.fetchall()]

    def count(self, *, namespace: str) -> int:
        scope, params = self._of_namespace(namespace)
        if scope is None:
            return 0
        with connections[self.mapping.database].cursor() as cursor:
            cursor.execute(f"SELECT count(*) FROM {self._q(self.mapping.table)} WHERE {scope}", params)
            return int(cursor.fetchone()[0])

    def input_of(self, task_id: str) -> Any:
        """One row's input, for a task adopted on first sight."""
        m = self.mapping
        if not m.input:
            return None
        with connections[m.database].cursor() as cursor:
            cursor.execute(
                f"SELECT {self._q(m.input)} FROM {self._q(m.table)} WHERE {self._q(m.key)} = %s", [task_id]
            )
            row = cursor.fetchone()
        return json_value(row[0]) if row else None

    def decide_many(self, asks: list[LegacyAsk]) -> list[LegacyVerdict]:
        """Distinct tasks' operations in one transaction of the legacy database: their rows locked in one statement
        in key order, that database's clock read after those locks, each decided as the emulated table decides
        it, then one UPDATE per row that changes.

        Inside a decision of ours (``rollout.legacy.legacy_unit``, our transaction open) that transaction stays
        open until ours ends: each write is recorded first as a ``LegacyDecision`` in ours, theirs commits after
        ours, or rolls back with it. Elsewhere (the write-through's applier, a command) it commits at once."""
        unit, m = current_unit(), self.mapping
        if unit is None or not connection.in_atomic_block:
            with transaction.atomic(using=m.database):
                return self._decide_locked(asks)[0]
        opened = unit.joined(m.database, lambda: _Open(connections[m.database]))
        verdicts, written = self._decide_locked(asks)
        opened.record(written)
        return verdicts

    def _decide_locked(self, asks: list[LegacyAsk]) -> tuple[list[LegacyVerdict], list[LegacyDecision]]:
        m = self.mapping
        ids = sorted({ask.fields["task_id"] for ask in asks})
        marks = ", ".join(["%s"] * len(ids))
        rows = {
            row.task_id: row
            for row in self._select(
                f"{self._q(m.key)} IN ({marks})", ids, tail=f" ORDER BY {self._q(m.key)} FOR UPDATE"
            )
        }
        now = self._clock()  # after the rows' locks
        verdicts, written = [], []
        for ask in asks:
            row = rows.get(ask.fields["task_id"])
            verdict, values = self._decide(row, now, ask)
            verdicts.append(verdict)
            if values and row is not None:
                self._write(ask.fields["task_id"], values, now)
                written.append(self._written(row, ask, values, now))
        interleave.reach("legacy_table.decided")
        return verdicts, written

    # --- reads for the pre-flight (rollout.legacy_check) ----------------------------------------------------------

    def sample(self, limit: int) -> list[LegacyClaim]:
        return self._select("1 = 1", [], tail=f" LIMIT {int(limit)}")

    def from_text(self, values: dict[str, str | None]) -> LegacyClaim:
        """A row as PostgreSQL's change stream sends it (every column as text) read as the adapter reads rows."""
        m = self.mapping
        typed: list[Any] = []
        for column in m.columns():
            value = values.get(column)
            if value is not None and column == m.expires:
                typed.append(_timestamp(value))
            elif value is not None and column == m.completed and m.completed_as == "true":
                typed.append(value == "t")
            else:
                typed.append(value)
        return self._row(tuple(typed))

    def from_values(self, values: dict[str, Any]) -> LegacyClaim:
        """A row as the binary log's row image has it (column name → value, typed by the reader)."""
        return self._row(tuple(values.get(column) for column in self.mapping.columns()))

    def changed_since(
        self, value: Any, key: str, *, limit: int, margin_seconds: float
    ) -> list[tuple[LegacyClaim, Any]]:
        """The polling observer's read: rows whose ``changed`` column (with the key as the tie-break) is past
        ``value``/``key``, oldest first, each with that value; a timestamp column only up to ``margin_seconds``
        ago (a write of a transaction still open when the poll passed its value would be skipped)."""
        m = self.mapping
        changed, q = self._q(m.changed), self._q
        where = f"({changed} > %s OR ({changed} = %s AND {q(m.key)} > %s))"
        params: list[Any] = [value, value, key]
        if isinstance(value, datetime):
            where += f" AND {changed} < CURRENT_TIMESTAMP(6) - INTERVAL %s MICROSECOND"
            params.append(int(margin_seconds * 1_000_000))
        columns = ", ".join(q(c) for c in m.columns())
        with connections[m.database].cursor() as cursor:
            cursor.execute(
                f"SELECT {columns}, {changed} FROM {q(m.table)} WHERE {where} "
                f"ORDER BY {changed}, {q(m.key)} LIMIT {int(limit)}",
                params,
            )
            return [(self._row(values[:-1]), values[-1]) for values in cursor.fetchall()]

    def quote(self, name: str) -> str:
        """A table or column name (schema.table too) quoted as the legacy database quotes it."""
        return self._q(name)

    # --- the parts -----------------------------------------------------------------------------------------------

    def _decide(self, row: LegacyClaim | None, now: datetime, ask: LegacyAsk) -> tuple[LegacyVerdict, dict]:
        namespace = ask.fields.get("namespace")
        if row is None or (namespace is not None and row.namespace != namespace):
            # Not in the team's table (or of another namespace there): nothing to decide on, nothing written.
            return LegacyVerdict(False, "MISSING", "", None, now), {}
        verdict, values = _DECIDE[ask.kind](row, now, **ask.fields)
        return verdict, values or {}

    def _written(
        self, row: LegacyClaim, ask: LegacyAsk, values: dict[str, Any], now: datetime
    ) -> LegacyDecision:
        """Our record of a write: the row as found (locked) and as written, in the columns the table maps."""
        found = self.state(row)
        after = LegacyClaim(
            owner_id=values.get("owner_id", row.owner_id),
            expires_at=values["expires_at"] if "expires_at" in values else row.expires_at,
            completed_by=values.get("completed_by", row.completed_by),
        )
        return LegacyDecision(
            namespace=row.namespace,
            task_id=row.task_id,
            operation=ask.kind,
            owner_id=ask.fields.get("owner_id", ""),
            found=found,
            expected=self.state(after),
            created_at=now,
        )

    def state_now(self, task_id: str) -> dict[str, Any]:
        """The task's row as it is once no transaction of theirs holds it (locked FOR UPDATE, then let go)."""
        with transaction.atomic(using=self.mapping.database):
            rows = self._select(f"{self._q(self.mapping.key)} = %s", [task_id], tail=" FOR UPDATE")
        return self.state(rows[0] if rows else None)

    def state(self, row: LegacyClaim | None) -> dict[str, Any]:
        """What a decision's write sets, as compared later (``same_state``): owner, expiry, and completion where the
        table maps it."""
        if row is None:
            return {}
        state: dict[str, Any] = {
            "owner_id": row.owner_id or "",
            "expires_at": row.expires_at.isoformat() if row.expires_at else None,
        }
        if self.mapping.completed:
            state["completed"] = bool(row.completed_by)
        return state

    def _write(self, task_id: str, values: dict[str, Any], now: datetime) -> None:
        """The decision's values, in the mapped columns only."""
        m = self.mapping
        assignments: list[tuple[str, Any]] = []
        if "owner_id" in values:  # a release clears it as the table's own convention does (NULL unless said)
            owner = values["owner_id"] or (None if m.released_owner == "null" else "")
            assignments.append((m.owner, owner))
        if "expires_at" in values:
            assignments.append((m.expires, self._db_value(values["expires_at"])))
        if "result" in values and m.result:
            result = values["result"]
            assignments.append((m.result, None if result is None else canonical_json(result).decode()))
        if "completed_by" in values and m.completed:
            if values["completed_by"]:
                completed = {"owner": values["completed_by"], "true": True, "now": self._db_value(now)}
                assignments.append((m.completed, completed[m.completed_as]))
            else:  # a rollback's write-back: not completed, in the column's own terms
                assignments.append((m.completed, False if m.completed_as == "true" else None))
        if not assignments:
            return
        if m.updated_at:
            assignments.append((m.updated_at, self._db_value(now)))
        sets = ", ".join(f"{self._q(column)} = %s" for column, _ in assignments)
        if m.version:  # their optimistic checks see every write of ours
            sets += f", {self._q(m.version)} = COALESCE({self._q(m.version)}, 0) + 1"
        with connections[m.database].cursor() as cursor:
            cursor.execute(
                f"UPDATE {self._q(m.table)} SET {sets} WHERE {self._q(m.key)} = %s",
                [value for _, value in assignments] + [task_id],
            )

    def _select(self, where: str, params: list[Any], tail: str = "") -> list[LegacyClaim]:
        m = self.mapping
        columns = ", ".join(self._q(c) for c in m.columns())
        with connections[m.database].cursor() as cursor:
            cursor.execute(f"SELECT {columns} FROM {self._q(m.table)} WHERE {where}{tail}", params)
            return [self._row(values) for values in cursor.fetchall()]

    def _row(self, values: tuple[Any, ...]) -> LegacyClaim:
        """A row as the rollout reads legacy rows: an unsaved ``LegacyClaim`` (never written to our database)."""
        m = self.mapping
        named = dict(zip(m.columns(), values, strict=True))
        completed = named.get(m.completed) if m.completed else None
        result = named.get(m.result) if m.result else None
        if isinstance(result, str):
            try:
                result = json.loads(result)
            except ValueError:
                pass  # a result the legacy application wrote as plain text is compared as that text
        return LegacyClaim(
            task_id=str(named[m.key]),
            namespace=m.namespace_of(named.get(m.namespace_column)),
            owner_id=named[m.owner] or "",
            expires_at=_aware(named[m.expires]),
            result=result,
            completed_by=_completed_by(completed, named[m.owner] or ""),
            result_digest=digest(result) if result is not None else "",
            pool="",
        )

    def _incomplete(self) -> str:
        column = self._q(self.mapping.completed)
        return {
            "owner": f"({column} IS NULL OR {column} = '')",
            "true": f"({column} IS NULL OR NOT {column})",
            "now": f"{column} IS NULL",
        }[self.mapping.completed_as]

    def _clock(self) -> datetime:
        connection = connections[self.mapping.database]
        sql = "SELECT clock_timestamp()" if connection.vendor == "postgresql" else "SELECT UTC_TIMESTAMP(6)"
        with connection.cursor() as cursor:
            cursor.execute(sql)
            value = cursor.fetchone()[0]
        return _aware(value)  # type: ignore[return-value]

    def _db_value(self, value: datetime | None) -> Any:
        """A datetime as the legacy database's driver takes it (MySQL: naive UTC)."""
        if value is None:
            return None
        return connections[self.mapping.database].ops.adapt_datetimefield_value(value)

    def _q(self, name: str) -> str:
        quote = connections[self.mapping.database].ops.quote_name
        return ".".join(quote(part) for part in name.split("."))


def json_value(value: Any) -> Any:
    """A column's value as a task's input: JSON text parsed, anything else as it is (bytes as text)."""
    if isinstance(value, bytes | bytearray | memoryview):
        value = bytes(value).decode()
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _aware(value: Any) -> datetime | None:
    """A timestamp read from the legacy database, aware: MySQL's DATETIME comes back naive, and is UTC here (the
    control plane writes UTC, and ``UTC_TIMESTAMP`` is its clock)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _timestamp(text: str) -> datetime:
    """PostgreSQL's text form of a timestamp (with or without a time zone: without is UTC here)."""
    value = datetime.fromisoformat(text if not text.endswith(("+00", "-00")) else text + ":00")
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _completed_by(value: Any, owner: str) -> str:
    """Who completed, as the emulated table says it ("" = not completed): the column's text, or for a boolean or
    timestamp column the row's owner (or "?" when the row names none)."""
    if value is None or value is False or value == "" or value == 0:
        return ""
    if isinstance(value, str):
        return value
    return owner or "?"


class _Open:
    """The legacy database's transaction held open across one of ours (``LegacyUnit``), and our records of what it
    wrote: committed after ours, those records then marked COMMITTED; or rolled back."""

    def __init__(self, legacy: Any):
        self.legacy = legacy
        self.ids: list[int] = []
        legacy.set_autocommit(False)

    def record(self, written: list[LegacyDecision]) -> None:
        if written:  # in our transaction, before theirs commits
            self.ids += [row.pk for row in LegacyDecision.objects.bulk_create(written)]

    def finish(self, commit: bool) -> None:
        committed = False
        try:
            if commit:
                interleave.reach("legacy_table.ours_committed")
                self.legacy.commit()
                committed = True
        finally:
            if not committed:  # ours rolled back, or we die here: theirs never happened
                self.legacy.rollback()
            self.legacy.set_autocommit(True)
        if self.ids and committed:
            LegacyDecision.objects.filter(pk__in=self.ids, resolved_at__isnull=True).update(
                resolved_at=Now(), outcome="COMMITTED"
            )


def same_state(row: dict[str, Any], expected: dict[str, Any]) -> bool:
    """A legacy row as a decision wrote it? Owner and completion exactly; the expiry to the second (a table may keep
    whole seconds)."""
    if row.get("owner_id") != expected.get("owner_id") or row.get("completed") != expected.get("completed"):
        return False
    have, want = row.get("expires_at"), expected.get("expires_at")
    if have is None or want is None:
        return have == want
    return abs((datetime.fromisoformat(have) - datetime.fromisoformat(want)).total_seconds()) < 1
