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

MySQL/MariaDB, reading the binary log (``LEGACY_OBSERVE_MYSQL`` binlog, or auto with the log on):

- ``log_bin`` on, ``binlog_format = ROW``, ``binlog_row_image = FULL`` (the row before each change, whole) and
  ``binlog_row_metadata = FULL`` (column names in the log);
- the grants a replica needs: REPLICATION SLAVE (REPLICA) and REPLICATION CLIENT (BINLOG MONITOR on MariaDB);
- the mapping's ``changed`` column, an updated-at timestamp with microseconds: the clock each change is judged on (the
  log's own event times are whole seconds, too coarse for leases of seconds);
- the server's clock in UTC (its timestamps are read as UTC, as the adapter writes them).

MySQL/MariaDB, polling (``poll``, or auto with the log off): the mapping names ``changed``, an updated-at timestamp
every write of the team's changes, indexed — the observer reads the rows past the last it saw. A per-row version
counter is refused: rows' counters are not one sequence, so "past the last row read" would skip rows.
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
        return
    _utc(report, connection)
    if mysql_method(connection) == "binlog":
        _binlog(report, mapping, connection, columns)
    else:
        report.passed.append(
            "observer: polling the changed column"
            + ("" if settings.LEGACY_OBSERVE_MYSQL == "poll" else " (log_bin is off)")
            + " — it sees the row at each pass, not every write; turn the binary log on to see every change "
            "(docs/adopting.md)"
        )
        _polling(report, mapping, connection, columns)


def mysql_method(connection: Any) -> str:
    """How observe mode follows a MySQL/MariaDB table: ``binlog`` or ``poll`` (LEGACY_OBSERVE_MYSQL; auto: the
    binlog where the server keeps one)."""
    wanted = settings.LEGACY_OBSERVE_MYSQL
    if wanted != "auto":
        return wanted
    return "binlog" if str(_one(connection, "SELECT @@log_bin")) in ("1", "ON") else "poll"


def _variable(connection: Any, name: str) -> Any:
    with connection.cursor() as cursor:
        cursor.execute("SHOW GLOBAL VARIABLES LIKE %s", [name])
        row = cursor.fetchone()
    return str(row[1]) if row else None


def _binlog(
    report: Any, mapping: TableMapping, connection: Any, columns: dict[str, tuple[str, bool]]
) -> None:
    report.passed.append("observer: the binary log (every change, in commit order)")
    wants = [
        (
            "log_bin",
            ("ON", "1"),
            "start the server with log_bin and a server_id (my.cnf [mysqld]: log_bin, "
            "server_id = 1; a restart) — or LEGACY_OBSERVE_MYSQL=poll, which sees only the states between passes",
        ),
        (
            "binlog_format",
            ("ROW",),
            "SET GLOBAL binlog_format = 'ROW' (and binlog_format = ROW in my.cnf): "
            "statement events do not carry the rows",
        ),
        (
            "binlog_row_image",
            ("FULL",),
            "SET GLOBAL binlog_row_image = 'FULL' (and in my.cnf): the observer "
            "judges each change against the whole row before it",
        ),
        (
            "binlog_row_metadata",
            ("FULL",),
            "SET GLOBAL binlog_row_metadata = 'FULL' (and in my.cnf; MariaDB 10.5+, "
            "MySQL 8.0.1+): the log names the columns",
        ),
    ]
    for name, good, fix in wants:
        value = _variable(connection, name)
        report.expect(value in good, f"{name} is {value}", f"{name} is {value}: {fix}")
    grants = " ".join(row[0] for row in _all(connection, "SHOW GRANTS FOR CURRENT_USER()")).upper()
    everything = "ALL PRIVILEGES ON *.*" in grants
    user = _one(connection, "SELECT CURRENT_USER()")
    report.expect(
        everything or "REPLICATION SLAVE" in grants or "REPLICATION REPLICA" in grants,
        f"{user} may read the binary log (REPLICATION SLAVE)",
        f"{user} may not read the binary log: GRANT REPLICATION SLAVE ON *.* TO {user}",
    )
    report.expect(
        everything or any(word in grants for word in ("REPLICATION CLIENT", "BINLOG MONITOR", "SUPER")),
        f"{user} may ask where the log is (REPLICATION CLIENT / BINLOG MONITOR)",
        f"{user} may not ask where the binary log is: GRANT REPLICATION CLIENT ON *.* TO {user} (MariaDB 10.5+: "
        "BINLOG MONITOR)",
    )
    kind = columns.get(mapping.changed, ("",))[0] if mapping.changed else ""
    report.expect(
        bool(mapping.changed) and any(word in kind for word in ("timestamp", "datetime")),
        f"changes are judged on {mapping.changed} ({kind})",
        "map 'changed' to an updated-at column (ALTER TABLE … ADD changed_at DATETIME(6) NOT NULL DEFAULT "
        "CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6)): each change is judged at that time — the binary "
        "log's own event times are whole seconds, too coarse to judge leases of seconds",
    )


def _all(connection: Any, sql: str) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return list(cursor.fetchall())


def _utc(report: Any, connection: Any) -> None:
    offset = _one(connection, "SELECT TIMESTAMPDIFF(MINUTE, UTC_TIMESTAMP(6), CURRENT_TIMESTAMP(6))")
    report.expect(
        offset == 0,
        "the server's clock is UTC (its timestamps are read as UTC)",
        f"the server's time zone is {offset} minutes off UTC: SET GLOBAL time_zone = '+00:00' (and "
        "default_time_zone in my.cnf) — the observer reads its timestamps as UTC",
    )


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
            "manage.py legacy_observe --resnapshot REASON --as ONCALL --yes (docs/adopting.md, runbook)",
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
    if not report.expect(
        any(word in kind for word in ("timestamp", "datetime")),
        f"changed column {mapping.changed} is {kind}",
        f"changed column {mapping.changed} is {kind}: it must be an updated-at timestamp (DATETIME(6) ON UPDATE "
        "CURRENT_TIMESTAMP(6)) — a per-row counter (a version) cannot be the cursor: each row counts on its own, so "
        "'past the last row read' skips rows whose counter is lower",
    ):
        return
    table = mapping.table.rpartition(".")[2]
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
    report.expect(
        any(info["columns"][:1] == [mapping.changed] for info in constraints.values()),
        f"{mapping.changed} is indexed",
        f"{mapping.changed} has no index of its own: CREATE INDEX ON {mapping.table} ({mapping.changed}) — the "
        "observer reads the rows past the last it saw",
    )
