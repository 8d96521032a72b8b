"""Large backlogs for the priority and fair-share tests (claim-v1.md §10), in seconds instead of minutes: the tasks'
places are stamped by the product (``fair_share.stamp`` for the whole lane at once, exactly as a create stamps one),
the rows are written in chunks. The tasks a test watches are created through the API."""

from __future__ import annotations

from django.db import transaction

from claims.digest import digest
from claims.models import Task, TaskState
from claims.services import _sql, fair_share
from claims.services._base import hold_namespace


def backlog(
    count: int, *, key: str = "", weight: float | None = None, priority: int = 3, namespace: str = "default"
) -> list[str]:
    """``count`` READY tasks of lane (``priority``, ``key``), in creation order; their ids."""
    ids = [f"bulk-{key or 'default'}-p{priority}-{n:07d}" for n in range(count)]
    with transaction.atomic():
        ns = hold_namespace(name=namespace)
        places = fair_share.stamp(ns, priority=priority, key=key, weight=weight, count=count)
        rows = [
            {
                "task_id": task_id,
                "namespace_id": ns.id,
                "node_id": "node",
                "input": {"n": n},
                "input_digest": digest({"n": n}),
                "depends_on": [],
                "replay_policy": "REPLAYABLE",
                "resources": [],
                "has_resources": False,
                "has_successors": False,
                "state": TaskState.READY,
                "state_version": 1,
                "scheduler_epoch": 0,
                "claim_generation": 0,
                "cancel_generation": 0,
                "priority": priority,
                "fairness_key": key,
                "fairness_weight": places.weight,
                "vtag": vtag,
                "created_at": ns.now,
                "updated_at": ns.now,
            }
            for n, (task_id, vtag) in enumerate(zip(ids, places.vtags, strict=True))
        ]
        chunk = 20_000 if _sql.is_postgres() else 1_000  # SQLite: under its limit of bound parameters
        for start in range(0, count, chunk):
            _sql.together(_sql.insert_many_statement(Task, rows[start : start + chunk]))
    return ids
