"""Observe mode on MySQL/MariaDB: a polling observer. The team's binaries keep writing their table; every pass reads
the rows whose ``changed`` column (the mapping's: an updated-at timestamp or a version number every write changes)
moved past the last row it read, compares each with its own copy of that row as last read (``ObservedRow``), and
judges the legacy decision the difference was — as the change stream does on PostgreSQL (``observe.judge``): one
transaction holds claim.v1's decision, legacy's history, the comparison, the position and the row's new copy.

**Its limits, which the shadow report states:** it sees a row's states at its passes, not every write. Two
decisions on one task between two passes (a claim and a release; an expiry, a takeover and a complete) are judged
as the one difference between the first and the last — hand-offs in between are not seen, so neither is their
mismatch. A timestamp ``changed`` is read only up to ``LEGACY_POLL_MARGIN_SECONDS`` ago, so that a write whose
transaction was still open when a pass went by is not skipped: a transaction of theirs open longer than that can
still be missed. The change stream (PostgreSQL) has neither limit.
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import partial
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.models import F

from claims import clock

from ..legacy import legacy_store
from ..legacy_check import check as preflight
from ..legacy_check import table_columns
from ..models import LegacyClaim, ObservedRow, ObserverPosition
from .adoption import adopt_seen
from .observe import ObserveRefused, decided, judge

_START = "1970-01-01T00:00:00+00:00"


def position_name() -> str:
    return f"poll:{legacy_store().mapping.table}"  # type: ignore[attr-defined]


def setup() -> ObserverPosition:
    """After the pre-flight passes: the position and, the first time, a copy of every row as it is now (nothing
    judged: the decisions before observing are not seen)."""
    report = preflight(observe=True)
    if report.problems:
        raise ObserveRefused("; ".join(report.problems))
    position, created = ObserverPosition.objects.get_or_create(
        name=position_name(), defaults={"lsn": "", "updated_at": clock.now()}
    )
    if created or not position.lsn:
        _copy_all(position)
        position.refresh_from_db()
    return position


def _copy_all(position: ObserverPosition) -> None:
    store = legacy_store()
    value: Any = None
    key = ""
    copies: list[ObservedRow] = []
    after: Any = _first_value(store)
    while True:
        rows = store.changed_since(after, key, limit=1000, margin_seconds=0)  # type: ignore[attr-defined]
        if not rows:
            break
        for row, changed in rows:
            copies.append(ObservedRow(task_id=row.task_id, state=_state(row)))
            value, key = changed, row.task_id
        after = value
    with transaction.atomic(durable=True):
        ObservedRow.objects.bulk_create(copies, ignore_conflicts=True)
        ObserverPosition.objects.filter(pk=position.pk).update(
            lsn=_text(value) if value is not None else _text(_first_value(store)),
            key=key,
            updated_at=clock.now(),
        )


def poll_once(*, limit: int = 1000) -> dict[str, Any]:
    """One pass: the rows past the position, oldest first, each judged (or only copied, when it decided nothing)."""
    store = legacy_store()
    position = ObserverPosition.objects.get(name=position_name())
    after = _value(position.lsn, store)
    counts = {"rows": 0, "judged": 0, "unknown": 0, "direct": 0}
    rows = store.changed_since(  # type: ignore[attr-defined]
        after, position.key, limit=limit, margin_seconds=settings.LEGACY_POLL_MARGIN_SECONDS
    )
    counts["more"] = int(len(rows) >= limit)
    oldest: datetime | None = None
    for row, changed in rows:
        counts["rows"] += 1
        moved = {"lsn": _text(changed), "key": row.task_id}
        copy = ObservedRow.objects.filter(pk=row.task_id).first()
        before = _claim(row, copy.state) if copy is not None else None
        at = _aware(changed) if isinstance(changed, datetime) else clock.now()
        oldest = at if oldest is None or at < oldest else oldest
        seen = decided(before, row, at, moved)

        def keep(row: LegacyClaim = row) -> None:
            _keep(row)

        if seen is not None and adopt_seen(task_id=row.task_id, namespace=row.namespace):
            claimed_first = _claim_first(before, row, at, position)
            if claimed_first is not None:  # a claim and its complete between two passes: judged as two
                first, middle = claimed_first
                judge(first, position.pk, also=partial(_keep, middle))
                seen = decided(middle, row, at, moved)
                assert seen is not None
            outcome = judge(seen, position.pk, also=keep)
            if outcome in counts:
                counts[outcome] += 1
            continue
        with transaction.atomic(durable=True):
            keep()
            unknown = 1 if seen is not None else 0
            ObserverPosition.objects.filter(pk=position.pk).update(
                **moved, unknown=F("unknown") + unknown, updated_at=clock.now()
            )
        counts["unknown"] += unknown
    return {**counts, "oldest": oldest}


def _claim_first(
    before: LegacyClaim | None, row: LegacyClaim, at: datetime, position: ObserverPosition
) -> tuple[Any, LegacyClaim] | None:
    """A row that went from not owned by X to owned and completed by X between two passes: X claimed it, then
    completed it. The claim is judged first, its copy of the row (the state between) kept with it and the position
    left where it was — a pass killed between the two judges only the complete again, from that copy. (A complete by
    someone who is not the row's owner is judged as it is: the stale overwrite, A16.)"""
    if (
        not row.completed_by
        or row.completed_by != row.owner_id
        or (before and before.owner_id == row.owner_id)
    ):
        return None
    middle = LegacyClaim(
        task_id=row.task_id, namespace=row.namespace, owner_id=row.owner_id, expires_at=row.expires_at
    )
    unmoved = {"lsn": position.lsn, "key": position.key}
    first = decided(before, middle, at, unmoved)
    return (first, middle) if first is not None else None


def _keep(row: LegacyClaim) -> None:
    ObservedRow.objects.update_or_create(task_id=row.task_id, defaults={"state": _state(row)})


def _state(row: LegacyClaim) -> dict[str, Any]:
    return {
        "owner_id": row.owner_id,
        "expires_at": row.expires_at.isoformat() if row.expires_at else None,
        "completed_by": row.completed_by,
        "result": row.result,
    }


def _claim(row: LegacyClaim, state: dict[str, Any]) -> LegacyClaim:
    expires = state.get("expires_at")
    return LegacyClaim(
        task_id=row.task_id,
        namespace=row.namespace,
        owner_id=state.get("owner_id") or "",
        expires_at=datetime.fromisoformat(expires) if expires else None,
        completed_by=state.get("completed_by") or "",
        result=state.get("result"),
    )


def _first_value(store: Any) -> Any:
    """Below every value the changed column can hold: the epoch for a timestamp, -1 for a version number."""
    with_time = _is_timestamp(store)
    return datetime.fromisoformat(_START).replace(tzinfo=None) if with_time else -1


def _is_timestamp(store: Any) -> bool:
    columns = table_columns(connections[store.mapping.database], store.mapping) or {}
    kind = columns.get(store.mapping.changed, ("",))[0]
    return "time" in kind or "date" in kind


def _aware(value: datetime) -> datetime:
    """MySQL's DATETIME comes back naive: UTC here, as the adapter reads every timestamp of theirs."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _text(value: Any) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)


def _value(text: str, store: Any) -> Any:
    if not text:
        return _first_value(store)
    try:
        return int(text)
    except ValueError:
        return datetime.fromisoformat(text)
