"""A task's place in the grant order (claim-v1.md §10): its priority first, then its share of the priority between
fairness keys, in proportion to their weights.

The method is start-time fair queueing (Goyal, Vin and Cheng, 1996), one queue per (priority, key) — a *lane*.
Each task is stamped, when it becomes a task of its lane (created, or moved to another priority), with a virtual
start time ``vtag``:

    vtag = max(lane's last vtag, the priority's virtual time V) + 1 / weight(key)

and claims take READY tasks in (priority, vtag, task_id) order, straight from one index. So a key of weight 3 has
three tasks in each unit of virtual time where a key of weight 1 has one: while both have claimable tasks, they are
granted 3 : 1. The published bound for unit tasks: over any run of grants in which keys ``f`` and ``g`` both have
claimable tasks, ``|grants_f / w_f − grants_g / w_g| ≤ 1 / w_f + 1 / w_g`` (SFQ's fairness theorem, every task
costing one grant). Within a lane the vtags rise by creation, so a key's own tasks go oldest first; with one key and
one priority (the defaults) the order is creation order — today's.

``V`` is where the priority's grants have got to: the later of its oldest READY task's vtag and its newest claimed
one's (a READY task nobody may take — its node unserved, its resources held — cannot hold ``V`` back while others are
granted past it); with neither, where its lanes ended. A key that was idle starts at ``V``: it gets no credit for
the time it waited, so no burst past the bound when it returns, and a new key's first task is granted at its share
from the start, however long the others' backlogs.

The lane's row is locked by the statement that stamps it, and ``V`` is read by the same statement: two tasks of one
lane never get one place, and a decision never rests on a value read before its lock. Nothing is written when a task
is granted: the schedule lives in the task rows and the lanes, in the database, shared by every app server.

A key's weight: the latest one a task gave stands (``FairnessKey``); it spaces the tasks stamped from then on — a task
already waiting keeps its place.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection
from django.db.models import Max, Min

from .. import interleave
from ..errors import Invalid
from ..models import FairnessKey, FairnessLane, Task, TaskState
from . import _sql
from ._base import NamespaceHold

DEFAULT_PRIORITY = 3
PRIORITIES = range(1, 6)


def checked_priority(priority: object) -> int:
    """``priority`` when it is a whole number from 1 to 5; ``Invalid`` naming the field otherwise (every door)."""
    if isinstance(priority, bool) or not isinstance(priority, int) or priority not in PRIORITIES:
        raise Invalid({"priority": ["A whole number from 1 (granted first) to 5 is required."]})
    return priority


@dataclass(frozen=True)
class Places:
    vtags: list[float]  # in order
    weight: float  # the key's weight that spaced them


def stamp(ns: NamespaceHold, *, priority: int, key: str, weight: float | None, count: int = 1) -> Places:
    """The places of ``count`` new tasks of lane (``priority``, ``key``) in ``ns``; a ``weight`` given is the key's
    from now on. Inside the caller's transaction, after the namespace hold and the task rows it locks, before the
    new task rows are written (the lock order: namespace, tasks, key, lane)."""
    if _sql.is_postgres():
        last, stride = _stamp_postgres(ns, priority, key, weight, count)
    else:  # SQLite: writers are serialised whole, so read, then write
        last, stride = _stamp_sqlite(ns, priority, key, weight, count)
    interleave.reach("fair_share.stamped")  # the lane stays locked until the caller's transaction ends
    return Places([last - (count - 1 - i) * stride for i in range(count)], 1.0 / stride)


# The priority's virtual time, read by the stamping statement itself. Params: [ns, priority] * 3.
_V = (
    "COALESCE(GREATEST("
    "(SELECT min(vtag) FROM claims_task WHERE namespace_id = %s AND state = 'READY' AND priority = %s), "
    "(SELECT max(vtag) FROM claims_task WHERE namespace_id = %s AND state = 'CLAIMED' AND priority = %s)), "
    "(SELECT max(last_vtag) FROM claims_fairnesslane WHERE namespace_id = %s AND priority = %s), 0)"
)


def _stamp_postgres(
    ns: NamespaceHold, priority: int, key: str, weight: float | None, count: int
) -> tuple[float, float]:
    with connection.cursor() as cursor:
        if weight is not None:
            cursor.execute(
                "INSERT INTO claims_fairnesskey (namespace_id, key, weight, updated_at) VALUES (%s, %s, %s, %s) "
                "ON CONFLICT (namespace_id, key) DO UPDATE SET weight = EXCLUDED.weight, "
                "updated_at = EXCLUDED.updated_at",
                [ns.id, key, weight, _sql.prep(FairnessKey, "updated_at", ns.now)],
            )
        stride = "1.0 / COALESCE((SELECT weight FROM claims_fairnesskey WHERE namespace_id = %s AND key = %s), 1.0)"
        v_params = [ns.id, priority] * 3
        cursor.execute(
            "INSERT INTO claims_fairnesslane AS l (namespace_id, priority, key, last_vtag) "
            f"VALUES (%s, %s, %s, {_V} + %s * {stride}) "
            "ON CONFLICT (namespace_id, priority, key) DO UPDATE "
            f"SET last_vtag = GREATEST(l.last_vtag, {_V}) + %s * {stride} "
            f"RETURNING l.last_vtag, {stride}",
            [
                *(ns.id, priority, key),
                *v_params,
                *(count, ns.id, key),
                *v_params,
                *(count, ns.id, key),
                *(ns.id, key),
            ],
        )
        last, stride_now = cursor.fetchone()
    return float(last), float(stride_now)


def _stamp_sqlite(
    ns: NamespaceHold, priority: int, key: str, weight: float | None, count: int
) -> tuple[float, float]:
    if weight is not None:
        FairnessKey.objects.update_or_create(
            namespace_id=ns.id, key=key, defaults={"weight": weight, "updated_at": ns.now}
        )
    else:
        weight = (
            FairnessKey.objects.filter(namespace_id=ns.id, key=key).values_list("weight", flat=True).first()
        )
    stride = 1.0 / (weight or 1.0)
    level = Task.objects.filter(namespace_id=ns.id, priority=priority)
    marks = [
        level.filter(state=TaskState.READY).aggregate(v=Min("vtag"))["v"],
        level.filter(state=TaskState.CLAIMED).aggregate(v=Max("vtag"))["v"],
    ]
    known = [mark for mark in marks if mark is not None]
    lanes = FairnessLane.objects.filter(namespace_id=ns.id, priority=priority)
    v = max(known) if known else (lanes.aggregate(v=Max("last_vtag"))["v"] or 0.0)
    lane, _ = FairnessLane.objects.get_or_create(
        namespace_id=ns.id, priority=priority, key=key, defaults={"last_vtag": v}
    )
    last = max(lane.last_vtag, v) + count * stride
    FairnessLane.objects.filter(pk=lane.pk).update(last_vtag=last)
    return last, stride
