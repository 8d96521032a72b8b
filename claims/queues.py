"""What waits, and who has been served (claim-v1.md §10): a namespace's READY backlog by priority and by fairness key,
and each key's share of the grants of the last minutes — for /metrics and the console's namespace page. Reads only.

The largest keys are shown by name and the rest summed as ``(other)``, so /metrics carries at most ``TOP_KEYS + 1``
series per namespace however many tenants share it."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import Count

from .models import EventKind, FairnessKey, Namespace, Task, TaskEvent, TaskState

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


def backlogs() -> dict[str, Queue]:
    """Every namespace's READY backlog by priority and by its largest keys (two grouped reads, /metrics)."""
    queues: dict[str, Queue] = defaultdict(Queue)
    ready = Task.objects.filter(state=TaskState.READY)
    for name, priority, n in ready.values_list("namespace__name", "priority").annotate(n=Count("*")):
        queues[name].by_priority[priority] = n
    keys: dict[str, Counter[str]] = defaultdict(Counter)
    for name, key, n in ready.values_list("namespace__name", "fairness_key").annotate(n=Count("*")):
        keys[name][key] = n
    for name, counts in keys.items():
        queues[name].by_key = _largest(counts)
    return dict(queues)


def queue(namespace: Namespace, now: datetime, *, minutes: int = SHARE_MINUTES) -> Queue:
    """One namespace's backlog, and each key's share of its grants since ``minutes`` ago (the claims' timeline rows,
    read through the index on (namespace, point, at): a few minutes of grants, whatever the history)."""
    ready = Task.objects.filter(namespace=namespace, state=TaskState.READY)
    result = Queue(minutes=minutes)
    result.by_priority = dict(ready.values_list("priority").annotate(n=Count("*")).order_by("priority"))
    result.by_key = _largest(Counter(dict(ready.values_list("fairness_key").annotate(n=Count("*")))))
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
