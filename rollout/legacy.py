"""The legacy claim store behind a small adapter interface.

``LegacyStore`` is what the rollout needs from today's claim table; ``DjangoLegacyStore`` reproduces its naive
semantics faithfully on ``rollout.LegacyClaim``: a claim is owner + expires_at, after expiry anyone takes over,
a heartbeat or release by the named owner succeeds, and ``complete`` writes the result without checking who
holds the claim now — last write wins. (Each operation is atomic — we reproduce the protocol's semantics, not
its implementation's races.)

Every decision runs inside the caller's transaction and follows the house rule: the store locks the row it decides
on, then reads the clock, then decides and writes — and reports the instant it decided on (``LegacyVerdict.at``).

To run the migration against an existing table, implement ``LegacyStore`` over it and set
``ROLLOUT_LEGACY_STORE`` to its dotted path; see docs/rollout.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any, Protocol, TypeVar

from django.conf import settings
from django.db import connection, transaction
from django.utils.module_loading import import_string

from claims import clock, interleave

from .models import LegacyClaim

T = TypeVar("T")


@dataclass(frozen=True)
class LegacyVerdict:
    accepted: bool
    word: str  # GRANTED | HELD | RENEWED | RELEASED | NOT_OWNER | COMPLETED
    owner_id: str
    expires_at: datetime | None
    at: datetime | None = None  # the clock the store decided on, read after its row lock

    @property
    def outcome(self) -> str:  # the word, as the legacy API answers it
        return self.word


class LegacyUnit:
    """One transaction of ours in which a legacy table in another database may decide (``legacy_unit``): that
    database's transaction is held open — its rows locked, its writes made — until ours ends, then committed after
    ours (``transaction.on_commit``) or rolled back with it. Stores that live in our database ignore it."""

    def __init__(self) -> None:
        self.open: dict[str, Any] = {}  # alias → the store's open transaction there (its ``finish(commit)``)

    def joined(self, alias: str, begin: Callable[[], T]) -> T:
        """``alias``'s open transaction, begun (``begin``) by the first decision of ours that needs it; it ends
        when ours does."""
        if alias not in self.open:
            self.open[alias] = begin()
            transaction.on_commit(lambda: self._finish(alias, True))
        return self.open[alias]

    def _finish(self, alias: str, commit: bool) -> None:
        opened = self.open.pop(alias, None)
        if opened is not None:
            opened.finish(commit)

    def close(self) -> None:
        """Ours did not commit (or the unit ends first): every transaction still open rolls back."""
        for alias in list(self.open):
            self._finish(alias, False)


_unit: ContextVar[LegacyUnit | None] = ContextVar("legacy_unit", default=None)


@contextmanager
def legacy_unit() -> Iterator[LegacyUnit]:
    """Around one transaction of ours in which legacy decides (the routed decision, ``legacy_decides``)."""
    unit = LegacyUnit()
    token = _unit.set(unit)
    try:
        yield unit
    finally:
        _unit.reset(token)
        unit.close()


def current_unit() -> LegacyUnit | None:
    return _unit.get()


@contextmanager
def outside_unit() -> Iterator[None]:
    """Legacy decides and commits at once here, whatever unit is around (the write-through's applier: theirs first,
    then ours marks it applied)."""
    token = _unit.set(None)
    try:
        yield
    finally:
        _unit.reset(token)


@dataclass(frozen=True)
class LegacyAsk:
    """One operation for ``decide_many``: ``kind`` is claim, heartbeat, release, complete or record (claim.v1's
    decision written through), ``fields`` that method's keyword arguments."""

    kind: str
    fields: dict[str, Any]


class LegacyStore(Protocol):
    # True when the table lives in another database (rollout.legacy_table): its writes cannot share our
    # transaction, so V1_WRITES' write-through goes by rollout.LegacyWrite (services/write_through.py).
    separate_database: bool

    def claim(
        self,
        *,
        task_id: str,
        namespace: str,
        owner_id: str,
        ttl_seconds: int,
        pool: str = "",
        via: str = "legacy",
    ) -> LegacyVerdict: ...

    def heartbeat(self, *, task_id: str, owner_id: str, ttl_seconds: int) -> LegacyVerdict: ...

    def release(self, *, task_id: str, owner_id: str) -> LegacyVerdict: ...

    def complete(
        self,
        *,
        task_id: str,
        namespace: str,
        owner_id: str,
        result: Any,
        result_digest: str,
        via: str = "legacy",
    ) -> LegacyVerdict: ...

    def record_claim(
        self, *, task_id: str, namespace: str, owner_id: str, expires_at: datetime | None, pool: str = ""
    ) -> None:
        """Write claim.v1's decision (V1_WRITES), whatever the row says: the rollback target must match it."""
        ...

    def get(self, *, task_id: str) -> LegacyClaim | None: ...

    def live_claims(self, *, namespace: str, now: datetime, pool: str | None = None) -> list[LegacyClaim]: ...


_METHODS = {"claim": "claim", "heartbeat": "heartbeat", "release": "release", "complete": "complete"}


def decide(store: LegacyStore, asks: list[LegacyAsk]) -> list[LegacyVerdict]:
    """Several tasks' operations in the caller's transaction: at once where the store can (``decide_many``, as
    ``DjangoLegacyStore`` does), else one by one through its single methods (``record`` answers RECORDED)."""
    many = getattr(store, "decide_many", None)
    if many is not None:
        return many(asks)
    verdicts = []
    for ask in asks:
        if ask.kind in ("record", "restore"):  # a store without decide_many keeps what completion it has
            store.record_claim(**ask.fields)
            verdicts.append(LegacyVerdict(True, "RECORDED", ask.fields["owner_id"], ask.fields["expires_at"]))
        else:
            verdicts.append(getattr(store, _METHODS[ask.kind])(**ask.fields))
    return verdicts


_COLUMNS = ("namespace", "owner_id", "expires_at", "result", "result_digest", "completed_by", "via", "pool")


class BatchOfOne:
    """A store that decides in batches (``decide_many``) answers each single method as a batch of one."""

    def decide_many(self, asks: list[LegacyAsk]) -> list[LegacyVerdict]:
        raise NotImplementedError

    def claim(self, *, task_id, namespace, owner_id, ttl_seconds, pool="", via="legacy") -> LegacyVerdict:
        return self._one("claim", locals())

    def heartbeat(self, *, task_id, owner_id, ttl_seconds) -> LegacyVerdict:
        return self._one("heartbeat", locals())

    def release(self, *, task_id, owner_id) -> LegacyVerdict:
        return self._one("release", locals())

    def complete(self, *, task_id, namespace, owner_id, result, result_digest, via="legacy") -> LegacyVerdict:
        # Unconditional: whoever completes last wins. This is the bug the migration exists to remove.
        return self._one("complete", locals())

    def record_claim(self, *, task_id, namespace, owner_id, expires_at, pool="") -> None:
        self._one("record", locals())

    def _one(self, kind: str, arguments: dict[str, Any]) -> LegacyVerdict:
        return self.decide_many([LegacyAsk(kind, {k: v for k, v in arguments.items() if k != "self"})])[0]


class DjangoLegacyStore(BatchOfOne):
    """The naive table on ``LegacyClaim``. Every method runs inside the caller's transaction, as one batch of one
    (``decide_many``): the rows FOR UPDATE, then the clock, then the writes."""

    separate_database = False

    def decide_many(self, asks: list[LegacyAsk]) -> list[LegacyVerdict]:
        """Several tasks' operations at once (distinct tasks): their rows locked in one statement in task_id order,
        one clock read after those locks, each decided as its single method decides it, then one write per kind of
        write — an UPDATE of the rows that exist, an INSERT of those that do not. A row another transaction
        inserted meanwhile (the INSERT skips it) is decided again, on the row it can now lock."""
        rows, now = _locked(sorted(ask.fields["task_id"] for ask in asks))
        verdicts: list[LegacyVerdict] = []
        updates: list[tuple[LegacyClaim, dict[str, Any]]] = []
        inserts: list[LegacyClaim] = []
        for ask in asks:
            row = rows.get(ask.fields["task_id"])
            verdict, values = _DECIDE[ask.kind](row, now, **ask.fields)
            verdicts.append(verdict)
            if values is None:
                continue
            values["updated_at"] = now
            target = row if row is not None else LegacyClaim(task_id=ask.fields["task_id"])
            for name, value in values.items():
                setattr(target, name, value)
            if row is not None:
                updates.append((row, values))
            else:
                inserts.append(target)
        interleave.reach("legacy_store.decided")
        _update(updates)
        lost = _insert_absent(inserts)
        if lost:
            redo = [ask for ask in asks if ask.fields["task_id"] in lost]
            again = dict(zip((ask.fields["task_id"] for ask in redo), self.decide_many(redo), strict=True))
            verdicts = [again.get(ask.fields["task_id"], v) for ask, v in zip(asks, verdicts, strict=True)]
        return verdicts

    def get(self, *, task_id) -> LegacyClaim | None:
        return LegacyClaim.objects.filter(pk=task_id).first()

    def get_many(self, *, task_ids: list[str]) -> dict[str, LegacyClaim]:
        return {row.task_id: row for row in LegacyClaim.objects.filter(pk__in=task_ids)}

    def live_claims(self, *, namespace, now, pool=None) -> list[LegacyClaim]:
        rows = LegacyClaim.objects.filter(namespace=namespace, expires_at__gt=now, completed_by="").exclude(
            owner_id=""
        )
        if pool is not None:
            rows = rows.filter(pool=pool)
        return list(rows)


Decision = tuple[LegacyVerdict, "dict[str, Any] | None"]


def _decide_claim(row, now, *, task_id, namespace, owner_id, ttl_seconds, pool="", via="legacy") -> Decision:
    if (
        row is not None
        and row.owner_id
        and row.owner_id != owner_id
        and row.expires_at
        and row.expires_at > now
    ):
        return LegacyVerdict(False, "HELD", row.owner_id, row.expires_at, now), None
    expires = now + timedelta(seconds=ttl_seconds)
    values = {"namespace": namespace, "owner_id": owner_id, "expires_at": expires, "pool": pool, "via": via}
    return LegacyVerdict(True, "GRANTED", owner_id, expires, now), values


def _decide_heartbeat(row, now, *, task_id, owner_id, ttl_seconds) -> Decision:
    if row is None or row.owner_id != owner_id:
        return _not_owner(row, now), None
    expires = now + timedelta(seconds=ttl_seconds)
    return LegacyVerdict(True, "RENEWED", owner_id, expires, now), {"expires_at": expires}


def _decide_release(row, now, *, task_id, owner_id) -> Decision:
    if row is None or row.owner_id != owner_id:
        return _not_owner(row, now), None
    return LegacyVerdict(True, "RELEASED", "", None, now), {"owner_id": "", "expires_at": None}


def _decide_complete(
    row, now, *, task_id, namespace, owner_id, result, result_digest, via="legacy"
) -> Decision:
    values = {
        "namespace": namespace,
        "result": result,
        "result_digest": result_digest,
        "completed_by": owner_id,
        "via": via,
    }
    return LegacyVerdict(True, "COMPLETED", owner_id, None, now), values


def _decide_record(row, now, *, task_id, namespace, owner_id, expires_at, pool="") -> Decision:
    values = {
        "namespace": namespace,
        "owner_id": owner_id,
        "expires_at": expires_at,
        "pool": pool,
        "via": "claim.v1",
    }
    return LegacyVerdict(True, "RECORDED", owner_id, expires_at, now), values


def _decide_restore(row, now, *, task_id, namespace, owner_id, expires_at) -> Decision:
    """A rollback's write-back of a task claim.v1 has not committed: its owner and expiry (or none), and no
    completion — whatever an old binary wrote there (the write-back reports it first: write_through.write_back)."""
    values = {
        "namespace": namespace,
        "owner_id": owner_id,
        "expires_at": expires_at,
        "result": None,
        "result_digest": "",
        "completed_by": "",
        "via": "claim.v1",
    }
    return LegacyVerdict(True, "RECORDED", owner_id, expires_at, now), values


_DECIDE: dict[str, Callable[..., Decision]] = {
    "claim": _decide_claim,
    "heartbeat": _decide_heartbeat,
    "release": _decide_release,
    "complete": _decide_complete,
    "record": _decide_record,
    "restore": _decide_restore,
}


def _locked(ids: list[str]) -> tuple[dict[str, LegacyClaim], datetime]:
    """The rows FOR UPDATE in task_id order, then the clock read after their locks: one statement on PostgreSQL
    (the locks taken in a materialised CTE, ``clock_timestamp()`` read per row as the outer query reads it — the
    latest reading is after the last lock; the outer join gives that reading when no row exists)."""
    if connection.vendor != "postgresql":
        rows = LegacyClaim.objects.select_for_update().filter(pk__in=ids).order_by("pk")
        return {row.task_id: row for row in rows}, clock.now()
    sql = (
        f"WITH locked AS MATERIALIZED (SELECT * FROM {LegacyClaim._meta.db_table} WHERE task_id = ANY(%s) "
        "ORDER BY task_id FOR UPDATE) "
        "SELECT locked.*, clock_timestamp() AS db_now FROM (VALUES (1)) one LEFT JOIN locked ON true"
    )
    read = list(LegacyClaim.objects.raw(sql, [ids]))
    latest = max(getattr(row, "db_now") for row in read)  # noqa: B009 - a column raw() adds, not a field
    return {row.task_id: row for row in read if row.task_id is not None}, clock.from_db(latest)


def _update(updates: list[tuple[LegacyClaim, dict[str, Any]]]) -> None:
    """The rows that existed, written: one UPDATE (several rows: one statement, a CASE per column)."""
    if len(updates) == 1:
        row, values = updates[0]
        LegacyClaim.objects.filter(pk=row.pk).update(**values)
    elif updates:
        names = sorted({name for _, values in updates for name in values})
        LegacyClaim.objects.bulk_update([row for row, _ in updates], names)


def _insert_absent(rows: list[LegacyClaim]) -> set[str]:
    """Insert rows that did not exist when locked, skipping any another transaction inserted since: the task_ids
    skipped (decided again by the caller)."""
    if not rows:
        return set()
    fields = _fields(("task_id", "updated_at", *_COLUMNS))
    values = ", ".join(["(" + ", ".join(["%s"] * len(fields)) + ")"] * len(rows))
    params = [
        field.get_db_prep_save(getattr(row, field.attname), connection) for row in rows for field in fields
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {LegacyClaim._meta.db_table} ({', '.join(f.column for f in fields)}) VALUES {values} "
            "ON CONFLICT (task_id) DO NOTHING RETURNING task_id",
            params,
        )
        inserted = {row[0] for row in cursor.fetchall()}
    return {row.task_id for row in rows} - inserted


def _not_owner(row: LegacyClaim | None, now: datetime) -> LegacyVerdict:
    return LegacyVerdict(
        False, "NOT_OWNER", row.owner_id if row else "", row.expires_at if row else None, now
    )


@cache
def _fields(names: tuple[str, ...]) -> list[Any]:
    return [LegacyClaim._meta.get_field(name) for name in names]


@cache
def legacy_store() -> LegacyStore:
    path = getattr(settings, "ROLLOUT_LEGACY_STORE", "rollout.legacy.DjangoLegacyStore")
    return import_string(path)()
