"""What waits, and who has been served (claim-v1.md §10): a namespace's READY backlog by priority and by fairness key,
and each key's share of the grants of the last minutes — for /metrics and the console's namespace page. Reads only.

The largest keys are shown by name and the rest summed as ``(other)``, so /metrics carries at most ``TOP_KEYS + 1``
series per namespace however many tenants share it. A read counts up to ``CLAIMS_BACKLOG_COUNT_CAP`` tasks per
namespace and priority and per key — past that, a key's backlog is read off its schedule — so its cost does not grow
with the backlog (docs/benchmarks.md: 10,000 against 1,000,000 READY tasks)."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Count

from .models import EventKind, FairnessKey, Namespace, TaskEvent

TOP_KEYS = 10
OTHER = "(other)"
SHARE_MINUTES = 5


@dataclass
class Queue:
    """One namespace's figures."""

    by_priority: dict[int, int] = field(default_factory=dict)  # READY tasks by priority
    by_key: list[tuple[str, int]] = field(
        default_factory=list
    )  # READY tasks of the largest keys, then (other)
    shares: list[dict] = field(
        default_factory=list
    )  # each key's grants of the last minutes: key, grants, share, weight
    minutes: int = SHARE_MINUTES

    @property
    def ready(self) -> int:
        return sum(self.by_priority.values())


def _largest(counts: Counter[str]) -> list[tuple[str, int]]:
    top = counts.most_common(TOP_KEYS)
    rest = sum(counts.values()) - sum(n for _, n in top)
    return top + ([(OTHER, rest)] if rest else [])


# Per namespace and priority: its READY tasks counted up to the cap — a range of the READY index (task_ready_order),
# stopped there.
_COUNTS = """
SELECT n.id, n.name, p.priority,
    (SELECT count(*) FROM (SELECT 1 FROM claims_task t WHERE t.namespace_id = n.id AND t.state = 'READY'
        AND t.priority = p.priority LIMIT %s) c)
FROM claims_namespace n CROSS JOIN (SELECT 1 AS priority UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4
    UNION ALL SELECT 5) p
"""

# Per lane (a key at a priority): its READY tasks counted up to the cap, and its first READY task's place — a range
# of the index by key (task_ready_key), stopped there.
_LANES = """
SELECT l.namespace_id, l.priority, l.key, l.last_vtag, COALESCE(k.weight, 1.0),
    (SELECT count(*) FROM (SELECT 1 FROM claims_task t WHERE t.namespace_id = l.namespace_id AND t.state = 'READY'
        AND t.priority = l.priority AND t.fairness_key = l.key LIMIT %s) c),
    (SELECT t.vtag FROM claims_task t WHERE t.namespace_id = l.namespace_id AND t.state = 'READY'
        AND t.priority = l.priority AND t.fairness_key = l.key ORDER BY t.vtag LIMIT 1)
FROM claims_fairnesslane l
LEFT JOIN claims_fairnesskey k ON k.namespace_id = l.namespace_id AND k.key = l.key
"""


def _rows(sql: str, params: list[int], namespace_id: int | None, column: str) -> list[tuple]:
    if namespace_id is not None:
        sql, params = f"{sql} WHERE {column} = %s", [*params, namespace_id]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def _counted(n: int, last: float, first: float | None, weight: float) -> int:
    """A lane's READY tasks: ``n`` counted below the cap; at the cap, what its schedule says lies between its first
    READY task and its last place (``services.fair_share`` stamps a key's tasks ``1/weight`` apart) — exact while
    its tasks leave in their order and its weight stands; a task cancelled, or moved to another priority, before
    its turn still counts until the lane moves past its place."""
    if n < backlog_cap() or first is None:
        return n
    return max(n, round((last - first) * weight) + 1)


def backlog_cap() -> int:
    return settings.CLAIMS_BACKLOG_COUNT_CAP


def _queues(namespace_id: int | None) -> dict[int, tuple[str, Queue]]:
    """Per namespace with READY tasks: each priority's count — exact below ``CLAIMS_BACKLOG_COUNT_CAP``, past it the
    sum of its lanes' — and the largest keys (``_counted``). Two statements, each a bounded range of an index per
    namespace and priority or per lane: what a read costs grows with the namespaces and keys, not the backlog."""
    cap = backlog_cap()
    queues: dict[int, tuple[str, Queue]] = {}
    exact: dict[tuple[int, int], int] = {}
    for ns_id, name, priority, n in _rows(_COUNTS, [cap], namespace_id, "n.id"):
        if n:
            exact[(ns_id, priority)] = n
            queues.setdefault(ns_id, (name, Queue()))
    by_lane: dict[tuple[int, int], int] = defaultdict(int)
    keys: dict[int, Counter[str]] = defaultdict(Counter)
    for ns_id, priority, key, last, weight, n, first in _rows(_LANES, [cap], namespace_id, "l.namespace_id"):
        counted = _counted(n, last, first, weight)
        if counted:
            by_lane[(ns_id, priority)] += counted
            keys[ns_id][key] += counted
    for (ns_id, priority), n in sorted(exact.items()):
        queues[ns_id][1].by_priority[priority] = n if n < cap else max(n, by_lane[(ns_id, priority)])
    for ns_id, counts in keys.items():
        if ns_id in queues:
            queues[ns_id][1].by_key = _largest(counts)
    return queues


def backlogs() -> dict[str, Queue]:
    """Every namespace's READY backlog by priority and by its largest keys, for /metrics: two reads whose cost is
    bounded by the namespaces, the cap and the keys — not by the backlog."""
    return dict(_queues(None).values())


def queue(namespace: Namespace, now: datetime, *, minutes: int = SHARE_MINUTES) -> Queue:
    """One namespace's backlog, and each key's share of its grants since ``minutes`` ago (the claims' timeline rows,
    read through the index on (namespace, point, at): a few minutes of grants, whatever the history)."""
    _, result = _queues(namespace.id).get(namespace.id, ("", Queue()))
    result.minutes = minutes
    grants = Counter(
        dict(
            TaskEvent.objects.filter(
                namespace=namespace,
                point="claim",
                kind__in=[EventKind.CLAIMED, EventKind.RECLAIMED],
                at__gte=now - timedelta(minutes=minutes),
            )
            .values_list("task__fairness_key")
            .annotate(n=Count("*"))
        )
    )
    total = sum(grants.values())
    weights = dict(FairnessKey.objects.filter(namespace=namespace).values_list("key", "weight"))
    result.shares = [
        {"key": key, "grants": n, "share": n / total, "weight": weights.get(key, 1.0)}
        for key, n in _largest(grants)
    ]
    return result
