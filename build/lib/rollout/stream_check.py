"""The change stream's pre-flight (``manage.py legacy_check --observe``): what observing the team's table without
touching its workers needs, asked before anything is created — no slot, no publication. Read-only.

PostgreSQL (logical decoding through the built-in ``pgoutput`` plugin):

- ``wal_level = logical`` — a restart (a parameter group setting on a managed service);
- the REPLICATION right (or superuser) for the connecting role — slots are made and read with it;
- the table's replica identity FULL — the observer judges each change against the row before it, which PostgreSQL
  sends with an UPDATE only under FULL (with NOTHING, a publication even makes the team's own UPDATEs fail:
  "cannot update table … because it does not have a replica identity and publishes updates");
- the publication, if it exists already, carries every column (a column list that leaves out part of the replica
  identity makes the team's UPDATEs fail too) and publishes updates;
- the slot, if it exists already, decodes with ``pgoutput`` and is not invalidated (``wal_status = lost``: WAL it
  needed is gone — take a new snapshot, docs/adopting.md);
- a free replication slot (``max_replication_slots``).

MySQL/MariaDB (the polling observer): the mapping names ``changed``, a column every write of the team's changes (an
updated-at timestamp or a version number), and it is indexed — the observer reads the rows past the last it saw.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from .legacy_table import TableMapping


def check_stream(
    report: Any, mapping: TableMapping, connection: Any, columns: dict[str, tuple[str, bool]]
) -> None:
    if connection.vendor == "postgresql":
        _postgresql(report, mapping, connection, columns)
    else:
        _polling(report, mapping, connection, columns)


def _one(connection: Any, sql: str, params: list[Any] | None = None) -> Any:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        row = cursor.fetchone()
    return row[0] if row else None


def _postgresql(
    report: Any, mapping: TableMapping, connection: Any, columns: dict[str, tuple[str, bool]]
) -> None:
    wal_level = _one(connection, "SHOW wal_level")
    report.expect(
        wal_level == "logical",
        "wal_level is logical",
        f"wal_level is {wal_level}: set wal_level = logical and restart PostgreSQL (on a managed service: its "
        "parameter group)",
    )
    role = _one(connection, "SELECT current_user")
    report.expect(
        bool(
            _one(connection, "SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user")
        ),
        f"role {role} has the REPLICATION right",
        f"role {role} may not read a change stream: ALTER ROLE {role} REPLICATION",
    )
    identity = _one(connection, "SELECT relreplident FROM pg_class WHERE oid = %s::regclass", [mapping.table])
    report.expect(
        identity == "f",
        f"{mapping.table} has REPLICA IDENTITY FULL",
        f"{mapping.table} has replica identity {_IDENTITY.get(identity, identity)}: ALTER TABLE {mapping.table} "
        "REPLICA IDENTITY FULL — the observer judges each change against the row before it, which PostgreSQL "
        "sends only under FULL",
    )
    _publication(report, mapping, connection, columns)
    _slot(report, connection)


def _publication(
    report: Any, mapping: TableMapping, connection: Any, columns: dict[str, tuple[str, bool]]
) -> None:
    publication = settings.LEGACY_OBSERVE_PUBLICATION
    published = _one(connection, "SELECT pubupdate FROM pg_publication WHERE pubname = %s", [publication])
    if published is None:
        report.passed.append(f"publication {publication} does not exist yet (the observer creates it)")
    else:
        report.expect(
            bool(published),
            f"publication {publication} publishes updates",
            f"publication {publication} does not publish updates: ALTER PUBLICATION {publication} SET "
            "(publish = 'insert, update, delete')",
        )
        carried = _one(
            connection,
            "SELECT attnames FROM pg_publication_tables WHERE pubname = %s AND tablename = %s",
            [publication, mapping.table.rpartition(".")[2]],
        )
        missing = sorted(set(columns) - set(carried or []))
        report.expect(
            carried is not None and not missing,
            f"publication {publication} carries every column of {mapping.table}",
            f"publication {publication} "
            + (
                f"leaves out {', '.join(missing)}"
                if carried is not None
                else f"does not publish {mapping.table}"
            )
            + f": the replica identity FULL needs every column — ALTER PUBLICATION {publication} SET TABLE "
            f"{mapping.table}",
        )


def _slot(report: Any, connection: Any) -> None:
    slot = settings.LEGACY_OBSERVE_SLOT
    with connection.cursor() as cursor:
        cursor.execute("SELECT plugin, wal_status FROM pg_replication_slots WHERE slot_name = %s", [slot])
        found = cursor.fetchone()
    if found is None:
        used = _one(connection, "SELECT count(*) FROM pg_replication_slots")
        limit = int(_one(connection, "SHOW max_replication_slots"))
        report.expect(
            used < limit,
            f"a replication slot is free ({used} of {limit} used)",
            f"all {limit} replication slots are used: raise max_replication_slots (a restart) or drop one",
        )
    else:
        plugin, wal_status = found
        report.expect(
            plugin == "pgoutput",
            f"slot {slot} decodes with pgoutput",
            f"slot {slot} decodes with {plugin}: drop it (SELECT pg_drop_replication_slot('{slot}')) — the "
            "observer uses the built-in pgoutput",
        )
        report.expect(
            wal_status != "lost",
            f"slot {slot} is usable (wal_status {wal_status})",
            f"slot {slot} was invalidated (wal_status lost: WAL it needed is gone): take a new snapshot — "
            "manage.py legacy_observe --resnapshot REASON --as ONCALL (docs/adopting.md, runbook)",
        )


_IDENTITY = {"d": "DEFAULT (the primary key)", "n": "NOTHING", "i": "USING INDEX", "f": "FULL"}


def _polling(
    report: Any, mapping: TableMapping, connection: Any, columns: dict[str, tuple[str, bool]]
) -> None:
    if not report.expect(
        bool(mapping.changed),
        "the mapping names the column every write changes",
        "the polling observer needs 'changed' in the mapping: a column every write of yours changes (an "
        "updated-at timestamp, e.g. DATETIME(6) ON UPDATE CURRENT_TIMESTAMP(6), or a version number)",
    ):
        return
    if not report.expect(
        mapping.changed in columns,
        f"changed column {mapping.changed} exists",
        f"changed: no column {mapping.changed} in {mapping.table}",
    ):
        return
    kind = columns[mapping.changed][0]
    report.expect(
        any(word in kind for word in ("timestamp", "datetime", "int")),
        f"changed column {mapping.changed} is {kind}",
        f"changed column {mapping.changed} is {kind}: it must be a timestamp or an integer version",
    )
    table = mapping.table.rpartition(".")[2]
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
    report.expect(
        any(info["columns"][:1] == [mapping.changed] for info in constraints.values()),
        f"{mapping.changed} is indexed",
        f"{mapping.changed} has no index of its own: CREATE INDEX ON {mapping.table} ({mapping.changed}) — the "
        "observer reads the rows past the last it saw",
    )
