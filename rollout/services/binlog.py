"""Observe mode on MySQL/MariaDB through the binary log: the team's binaries keep writing their table; the control
plane reads the server's row-based binary log as a replica of its own (``mysql-replication``, PyPI) and judges each
legacy decision it sees with claim.v1 in shadow — every change, in commit order, as the change stream does on
PostgreSQL (``observe.judge``; docs/adopting.md).

Position, crash-safe: ``ObserverPosition.lsn`` is ``file:offset`` of the first event of a transaction (its GTID
event) and ``index`` how many of its row changes are judged; each judgement writes it in the same transaction as the
comparison, so a killed observer resumes there, judging no change twice and skipping none. ``gtid`` records the
transaction's global id where the server has GTIDs (MariaDB always; MySQL with gtid_mode ON), for the operator.

Time: each change is judged at the row's ``changed`` column as the change wrote it (an updated-at timestamp with
microseconds, set by the statement that made it), in the log's order — never at the time the observer read it. The
log's own event times are whole seconds; they are used only when the mapping names no ``changed`` column (the
pre-flight refuses that).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.db.models import F
from django.db.models.functions import Now

from claims import clock

from ..legacy import legacy_store
from ..legacy_check import check as preflight
from ..models import ObserverPosition
from .adoption import adopt_seen
from .observe import Observed, ObserveRefused, decided, judge


def position_name() -> str:
    return f"binlog:{legacy_store().mapping.table}"  # type: ignore[attr-defined]


def setup() -> ObserverPosition:
    """After the pre-flight passes: the position, the first time at the end of the log as it is now (the decisions
    before observing are not seen — entering SHADOW imports the table as it is)."""
    report = preflight(observe=True)
    if report.problems:
        raise ObserveRefused("; ".join(report.problems))
    name = position_name()
    position = ObserverPosition.objects.filter(name=name).first()
    if position is not None:
        return position
    file, offset, gtid = _log_end()
    return ObserverPosition.objects.create(
        name=name, lsn=f"{file}:{offset}", gtid=gtid, updated_at=clock.now()
    )


def _log_end() -> tuple[str, int, str]:
    legacy = connections[legacy_store().mapping.database]  # type: ignore[attr-defined]
    with legacy.cursor() as cursor:
        cursor.execute("SHOW MASTER STATUS")
        row = cursor.fetchone()
        if row is None:
            raise ObserveRefused(
                "the legacy server keeps no binary log (log_bin is off): legacy_check --observe"
            )
        gtid = ""
        if legacy.mysql_is_mariadb:  # type: ignore[attr-defined]
            cursor.execute("SELECT @@gtid_binlog_pos")
            gtid = cursor.fetchone()[0] or ""
        elif len(row) > 4:
            gtid = row[4] or ""
    return row[0], int(row[1]), gtid


def _reader(file: str, offset: int) -> Any:
    from pymysqlreplication import BinLogStreamReader

    logging.getLogger("pymysqlreplication").setLevel(logging.WARNING)  # it logs its settings at every connect
    from pymysqlreplication.event import GtidEvent, MariadbGtidEvent, QueryEvent, RotateEvent, XidEvent
    from pymysqlreplication.row_event import DeleteRowsEvent, UpdateRowsEvent, WriteRowsEvent

    store = legacy_store()
    mapping = store.mapping  # type: ignore[attr-defined]
    legacy = connections[mapping.database]
    db = legacy.settings_dict
    schema, _, table = mapping.table.rpartition(".")
    return BinLogStreamReader(
        connection_settings={
            "host": db["HOST"] or "127.0.0.1",
            "port": int(db["PORT"] or 3306),
            "user": db["USER"],
            "password": db["PASSWORD"] or "",
        },
        server_id=settings.LEGACY_BINLOG_SERVER_ID,
        blocking=False,
        resume_stream=True,
        log_file=file,
        log_pos=offset,
        only_events=[
            WriteRowsEvent,
            UpdateRowsEvent,
            DeleteRowsEvent,
            XidEvent,
            GtidEvent,
            MariadbGtidEvent,
            QueryEvent,
            RotateEvent,
        ],
        only_tables=[table],
        only_schemas=[schema or db["NAME"]],
        # By file and offset on both servers (COM_BINLOG_DUMP): the reader's MariaDB mode would start from the
        # log's beginning unless given a GTID state; MariaDB's GTID events are read either way.
        is_mariadb=False,
    )


def observe_once(*, limit: int = 1000) -> dict[str, Any]:
    """Read the log from the position, whole transactions, until ``limit`` row changes (or the log's end); judge the
    legacy decisions among them, each with the position in its transaction. Returns counts."""
    from pymysqlreplication.event import GtidEvent, MariadbGtidEvent, QueryEvent, XidEvent
    from pymysqlreplication.row_event import UpdateRowsEvent, WriteRowsEvent

    store = legacy_store()
    position = ObserverPosition.objects.get(name=position_name())
    file, _, offset = position.lsn.rpartition(":")
    # ``start``: where the transaction being read began (the end of the one before it), ``skip``: its changes judged.
    start, skip, gtid = f"{file}:{offset}", position.index, position.gtid
    counts = {"transactions": 0, "judged": 0, "unknown": 0, "direct": 0, "more": 0}
    index = changes = 0
    ended = False
    oldest: datetime | None = None
    stream = _reader(file, int(offset))
    try:
        for event in stream:
            if isinstance(event, GtidEvent | MariadbGtidEvent):
                gtid = str(event.gtid)
            elif isinstance(event, XidEvent) or (isinstance(event, QueryEvent) and event.query == "COMMIT"):
                start, skip, index, ended = f"{stream.log_file}:{event.packet.log_pos}", 0, 0, True
                counts["transactions"] += 1
                if changes >= limit:
                    counts["more"] = 1
                    break
            elif isinstance(event, WriteRowsEvent | UpdateRowsEvent):
                for row in event.rows:
                    index += 1
                    changes += 1
                    if index <= skip:
                        continue
                    before, after = row.get("before_values"), row.get("after_values") or row.get("values")
                    moved = {"lsn": start, "index": index, "gtid": gtid}
                    adopted = store.from_values(after)  # type: ignore[attr-defined]
                    known = adopt_seen(task_id=adopted.task_id, namespace=adopted.namespace, values=after)
                    seen = decided(
                        store.from_values(before) if before else None,  # type: ignore[attr-defined]
                        store.from_values(after),  # type: ignore[attr-defined]
                        _when(store, after, event.timestamp),
                        moved,
                    )
                    if seen is not None and (oldest is None or seen.committed_at < oldest):
                        oldest = seen.committed_at
                    outcome = _judge(seen, position.pk, moved, known=known)
                    if outcome in counts:
                        counts[outcome] += 1
    finally:
        stream.close()
    if ended:  # every transaction up to ``start`` wholly judged
        ObserverPosition.objects.filter(pk=position.pk).update(
            lsn=start, index=0, gtid=gtid, updated_at=Now()
        )
    file, _, offset = start.rpartition(":")
    ObserverPosition.objects.filter(pk=position.pk).update(lag_bytes=_behind((file, int(offset))))
    return {**counts, "oldest": oldest}


def _judge(seen: Observed | None, position_id: int, moved: dict[str, Any], *, known: bool) -> str:
    """A change that decided nothing moves nothing (read again after a crash, it decides nothing again); one of a
    row that is no task of its namespace is counted unknown."""
    if seen is None:
        return "passed"
    if not known:
        with transaction.atomic(durable=True):
            ObserverPosition.objects.filter(pk=position_id).update(
                **moved, unknown=F("unknown") + 1, updated_at=Now()
            )
        return "unknown"
    return judge(seen, position_id)


def _when(store: Any, values: dict[str, Any], stamp: int) -> datetime:
    """When legacy made the change: the row's ``changed`` column as the change wrote it (UTC), else the log event's
    whole second."""
    changed = store.mapping.changed
    value = values.get(changed) if changed else None
    if isinstance(value, datetime):
        return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    return datetime.fromtimestamp(stamp, tz=UTC)


def _behind(at: tuple[str, int]) -> int | None:
    """Bytes of the log past ``at``: the log's end minus the position (files' sizes between them counted)."""
    legacy = connections[legacy_store().mapping.database]  # type: ignore[attr-defined]
    with legacy.cursor() as cursor:
        cursor.execute("SHOW BINARY LOGS")
        logs = [(row[0], int(row[1])) for row in cursor.fetchall()]
    behind, counting = 0, False
    for name, size in logs:
        if name == at[0]:
            counting = True
            behind += max(0, size - at[1])
        elif counting:
            behind += size
    return behind if counting else None
