"""Issue 39, 4 — the legacy observer loses no stream position in an asynchronous failover of our database.

Observe mode follows a team's PostgreSQL table through a logical replication slot in *their* database, and records
its judgements and its position in *ours* (the HA cluster). An asynchronous failover can lose our last commits. If
the slot had already let those changes go, they would never be judged. With ``LEGACY_OBSERVE_SLOT_RELEASE=standby``
the slot forgets a change only once our record of it is flushed on every standby:

1. asynchronous replication, standbys streaming: the observer's passes release the slot to its position, one pass
   behind (the release path, on real standbys);
2. the leader cut off from its standbys: legacy workers claim two more jobs, the observer judges them — and the slot
   keeps them, since no standby has those judgements;
3. the leader SIGKILLed, a standby promoted without them: the next pass reads them from the slot again and judges
   them on the new leader. Every legacy claim is judged there.

``commit`` (the old behaviour; ``auto`` where no standby is connected) releases at once: after the same failover the
two claims are judged nowhere — the case this setting exists for.
"""

from __future__ import annotations

import json
import os
import time

import httpx
import psycopg
import pytest

from examples.legacy_jobs.app import MAPPING
from tests.support import ha

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.serial,
    pytest.mark.timeout(400),
    pytest.mark.skipif(
        not os.environ.get("LEGACY_OBSERVE_PG_URL"),
        reason="needs the wal_level = logical PostgreSQL (LEGACY_OBSERVE_PG_URL; .ci/run sets it)",
    ),
]


def _theirs(name: str) -> str:
    """A database of its own on the logical cluster, with the example application's table."""
    base = os.environ["LEGACY_OBSERVE_PG_URL"].rsplit("/", 1)[0]
    with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
        for slot in admin.execute(
            "SELECT slot_name FROM pg_replication_slots WHERE database = %s", (name,)
        ).fetchall():
            admin.execute("SELECT pg_drop_replication_slot(%s)", slot)
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    url = f"{base}/{name}"
    with psycopg.connect(url, autocommit=True) as db:
        db.execute(
            "CREATE TABLE jobs (job_id varchar(64) PRIMARY KEY, queue text NOT NULL, payload text NOT NULL, "
            "locked_by text, locked_until timestamptz, output jsonb, finished_by text)"
        )
        db.execute("ALTER TABLE jobs REPLICA IDENTITY FULL")
    return url


def _their_sql(url: str, query: str, params: tuple = ()) -> list:
    with psycopg.connect(url, autocommit=True) as db:
        cursor = db.execute(query, params)
        return cursor.fetchall() if cursor.description else []


@pytest.mark.parametrize("release", ["standby", "commit"])
def test_an_asynchronous_failover_leaves_no_legacy_change_unjudged(cluster, release):
    cluster.script("sync", "off")
    theirs, ns = _theirs(f"ha_theirs_{release}"), f"ha-observed-{release}"
    env = {
        "LEGACY_DATABASE_URL": theirs,
        "ROLLOUT_LEGACY_STORE": "rollout.legacy_table.TableLegacyStore",
        "ROLLOUT_LEGACY_TABLE": json.dumps({**MAPPING, "database": "legacy"}),
        "LEGACY_OBSERVE_SLOT": f"ha_observer_{release}",
        "LEGACY_OBSERVE_PUBLICATION": f"ha_observer_{release}",
        "LEGACY_OBSERVE_SLOT_RELEASE": release,
        "TOKEN_CACHE_SECONDS": "0",
    }
    server = cluster.control_plane(**env)
    operator = {"Authorization": f"Bearer {cluster.token('ha-observe-op', 'operator')}"}
    with httpx.Client(base_url=server.url, timeout=30, headers=operator) as http:
        namespace = ha.answered(http, "POST", "/api/v1/namespaces", json={"name": ns, "stage": "SHADOW"})
        assert namespace.status_code in (200, 201), namespace.text
        jobs = [f"{release}-job-{i}" for i in range(4)]
        for job in jobs:
            body = {"task_id": job, "namespace": ns, "node_id": "n", "input": {}}
            created = ha.answered(http, "POST", "/api/v1/tasks", json=body)
            assert created.status_code in (200, 201), created.text
            _their_sql(theirs, "INSERT INTO jobs (job_id, queue, payload) VALUES (%s, %s, 'p')", (job, ns))
    slot = env["LEGACY_OBSERVE_SLOT"]

    def observe() -> None:
        cluster.manage("legacy_observe", "--once", **env)

    def claim(job: str) -> None:
        _their_sql(
            theirs,
            "UPDATE jobs SET locked_by = 'old-w', locked_until = now() + interval '60 seconds' WHERE job_id = %s",
            (job,),
        )

    def confirmed() -> str:
        return _their_sql(
            theirs, "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        )[0][0]

    def judged() -> set[str]:
        rows = cluster.sql("select task_id from rollout_legacyevent where namespace = %s", (ns,))
        return {row[0] for row in rows}

    cluster.manage("legacy_observe", "--setup", "--once", **env)
    # 1. Standbys streaming: judged, then released a pass later once they have flushed our record.
    claim(jobs[0]), claim(jobs[1])
    observe()
    position = cluster.sql("select lsn from rollout_observerposition where name = %s", (slot,))[0][0]
    deadline = time.monotonic() + 30
    while confirmed() != position:
        assert time.monotonic() < deadline, (confirmed(), position, cluster.script("status"))
        time.sleep(0.5)
        observe()
    assert judged() == set(jobs[:2])

    # 2. Cut off from its standbys, the leader judges two more claims; the slot keeps them (standby) or not.
    cluster.script("pause-replication")
    kept = confirmed()
    claim(jobs[2]), claim(jobs[3])
    observe()
    observe()
    assert judged() == set(jobs)
    if release == "standby":
        assert confirmed() == kept
    else:
        assert confirmed() != kept

    # 3. The leader dies; the promoted standby lacks those judgements. The next pass finds what the slot kept.
    cluster.kill_leader()
    assert judged() == set(jobs[:2])  # lost with the old leader
    observe()
    if release == "standby":
        assert judged() == set(jobs)  # judged again on the new leader: nothing left unjudged
    else:
        assert judged() == set(jobs[:2])  # the slot had let them go: never judged
