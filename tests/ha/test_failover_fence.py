"""Issue 39, 3 — a failover that loses acknowledged history is a fence.

The hard way, on a real cluster (``scripts/ha-cluster.sh``: three PostgreSQL nodes under Patroni, HAProxy to the
leader), with the control plane's production server on it:

- asynchronous replication and the leader cut off from its replicas (``pause-replication``);
- worker A claims a task: answered 200 by the leader, and on no other node;
- the leader dies (SIGKILL, with its processes) and Patroni promotes a replica: A's grant is gone from the history;
- worker B claims the same task on the new leader.

Without the fence B is handed A's token again — the same task, generation and epoch — and a downstream that fences on
them takes both workers' writes. With it the control plane finds the new timeline before any decision on it, bumps
every namespace's epoch (audited as a system fence with its cause), and A is FENCED (EPOCH) wherever it shows up.

With synchronous replication nothing acknowledged is lost: A's grant is on the new leader, no fence is raised, and A
renews its lease there.
"""

from __future__ import annotations

import re

import httpx
import pytest

from tests.support import ha

pytestmark = [pytest.mark.postgres, pytest.mark.serial, pytest.mark.timeout(400)]


def _people(cluster):
    server = cluster.servers[0] if cluster.servers else cluster.control_plane(TOKEN_CACHE_SECONDS="0")
    tokens = {
        name: cluster.token(name, role)
        for name, role in [("ha-operator", "operator"), ("worker-a", "worker"), ("worker-b", "worker")]
    }
    return server, {name: {"Authorization": f"Bearer {token}"} for name, token in tokens.items()}


def _create(http, who, task_id):
    body = {"task_id": task_id, "node_id": "n", "input": {}}
    created = ha.answered(http, "POST", "/api/v1/tasks", headers=who["ha-operator"], json=body)
    assert created.status_code == 201, created.text


def _claim(http, headers, task_id, owner, epoch):
    return ha.answered(
        http,
        "POST",
        f"/api/v1/tasks/{task_id}/claim",
        headers=headers,
        json={"owner_id": owner, "scheduler_epoch": epoch, "ttl_seconds": 300},
    )


def _renew(http, headers, task_id, grant, owner):
    return ha.answered(
        http,
        "POST",
        f"/api/v1/tasks/{task_id}/renew",
        headers=headers,
        json={
            key: grant[key]
            for key in ("attempt_id", "claim_generation", "scheduler_epoch", "cancel_generation")
        }
        | {"owner_id": owner, "extend_seconds": 300},
    )


def _epoch(cluster) -> int:
    return cluster.sql("select scheduler_epoch from claims_namespace where name = 'default'")[0][0]


def test_synchronous_failover_keeps_the_grant_and_raises_no_fence(cluster):
    server, who = _people(cluster)
    with httpx.Client(base_url=server.url, timeout=30) as http:
        _create(http, who, "ha-sync")
        epoch = _epoch(cluster)
        grant = _claim(http, who["worker-a"], "ha-sync", "worker-a", epoch).json()
        assert grant["outcome"] == "CLAIMED", grant
        timeline_before = cluster.sql("select timeline_id from pg_control_checkpoint()")[0][0]

        cluster.kill_leader()

        renewed = _renew(http, who["worker-a"], "ha-sync", grant, "worker-a")
        assert renewed.status_code == 200, renewed.text
        # Patroni names the new leader's synchronous standby a moment after the promotion; the next decision
        # records it.
        cluster.wait_for_sync_standby()
        assert _renew(http, who["worker-a"], "ha-sync", grant, "worker-a").status_code == 200

    # The grant is on the new leader, under the epoch it was given in: nothing acknowledged was lost, no fence.
    assert cluster.sql(
        "select count(*) from claims_attempt where attempt_id = %s", (grant["attempt_id"],)
    ) == [(1,)]
    assert _epoch(cluster) == epoch
    assert cluster.sql("select count(*) from claims_auditentry where action = 'failover_fence'") == [(0,)]
    after = cluster.sql(
        "select timeline, synchronous, fenced from claims_servedhistory where timeline > %s order by id",
        (timeline_before,),
    )
    assert after and not any(fenced for _, _, fenced in after)
    assert after[-1][1] is True  # synchronous again, recorded


def test_a_failover_that_lost_a_grant_fences_the_lost_token(cluster):
    server, who = _people(cluster)
    cluster.script("sync", "off")
    with httpx.Client(base_url=server.url, timeout=30) as http:
        _create(http, who, "ha-async")
        epoch = _epoch(cluster)
        fences_before = cluster.sql("select count(*) from claims_auditentry where action = 'failover_fence'")[
            0
        ][0]
        # The control plane has served the asynchronous cluster before the partition: a decision records it (see
        # services/serving.py on a switch to asynchronous replication that a failover loses).
        warm = _claim(http, who["worker-b"], "ha-async", "worker-b", epoch).json()
        assert warm["outcome"] == "CLAIMED", warm
        assert (
            ha.answered(
                http,
                "POST",
                "/api/v1/tasks/ha-async/release",
                headers=who["worker-b"],
                json={k: warm[k] for k in ("attempt_id", "claim_generation", "scheduler_epoch")}
                | {"owner_id": "worker-b"},
            ).status_code
            == 200
        )
        assert cluster.sql("select synchronous from claims_servedhistory order by id desc limit 1") == [
            (False,)
        ]

        cluster.script("pause-replication")
        lost = _claim(http, who["worker-a"], "ha-async", "worker-a", epoch)
        assert lost.status_code == 200, lost.text  # acknowledged by the leader alone
        lost = lost.json()

        cluster.kill_leader()

        # The history after the cut is gone: A's grant is on no node.
        assert cluster.sql(
            "select count(*) from claims_attempt where attempt_id = %s", (lost["attempt_id"],)
        ) == [(0,)]
        current = _epoch(cluster)
        fresh = _claim(http, who["worker-b"], "ha-async", "worker-b", current)
        if (
            fresh.status_code == 409 and fresh.json().get("reason") == "EPOCH"
        ):  # B carried the epoch from before
            fresh = _claim(
                http, who["worker-b"], "ha-async", "worker-b", fresh.json()["current"]["scheduler_epoch"]
            )
        assert fresh.status_code == 200, fresh.text
        fresh = fresh.json()

        # The two tokens differ: the new one is from a later epoch.
        token = ("claim_generation", "scheduler_epoch")
        assert tuple(fresh[k] for k in token) != tuple(lost[k] for k in token), (fresh, lost)
        assert fresh["scheduler_epoch"] > lost["scheduler_epoch"]

        stale = _renew(http, who["worker-a"], "ha-async", lost, "worker-a")
        assert stale.status_code == 409 and stale.json()["outcome"] == "FENCED", stale.text
        assert stale.json()["reason"] == "EPOCH"
        assert _renew(http, who["worker-b"], "ha-async", fresh, "worker-b").status_code == 200
        # Seen and paged: the fenced failover is on /metrics.
        page = http.get("/metrics").text
        assert re.search(r"^claims_database_failover_fences_total [1-9]", page, flags=re.MULTILINE), page[
            -3000:
        ]

    audited = cluster.sql(
        "select principal, role, namespace, reason from claims_auditentry where action = 'failover_fence' "
        "order by id"
    )
    assert len(audited) > fences_before
    assert all(row[0] == "system:failover" and "timeline" in row[3] for row in audited[fences_before:])
    assert _epoch(cluster) == epoch + 1
    # Claims are not left paused: nothing to clean up by hand.
    assert cluster.sql("select claims_paused from claims_namespace where name = 'default'") == [(False,)]
