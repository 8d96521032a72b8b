"""The grant order checked over a run's records (claim-v1.md §10; docs/architecture.md, "Priority and fair share").

Read from the database's own rows — each task's priority, key and creation, each attempt's start (the decision's
clock, read after its locks) — not from the clients' logs:

- **priority**: no first grant of a task while a task of a better priority was claimable by that request and nobody
  else was deciding on it. A READY task T of a better priority is counted against a grant G when T was created
  ``MARGIN`` before G's decision and its own first grant came ``MARGIN`` after it (or never): the decisions of the run
  last milliseconds, so T was neither being decided on nor new when G was decided. The run's claims have no node
  filter and its tasks no resources, so every READY task is claimable by every claim.
- **fair share**: among first grants of one priority, in decision order, over every window in which two keys both
  still had tasks waiting, ``|g_f / w_f − g_g / w_g|`` stays within the published bound ``1/w_f + 1/w_g`` plus
  ``slack`` — the grants of concurrent claim transactions, each taking the next tasks in order, may be recorded a
  few places apart.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from itertools import accumulate

from claims.models import Attempt, Task

MARGIN = timedelta(seconds=1)


@dataclass
class OrderVerdict:
    grants: int
    priority_violations: list[str]
    worst_excess: float  # the largest window's excess over the bound plus slack (≤ 0 holds)
    windows_checked: int


def check_order(namespace: str, *, slack: float) -> OrderVerdict:
    tasks = {
        t.task_id: t
        for t in Task.objects.filter(namespace__name=namespace).only(
            "task_id", "priority", "fairness_key", "fairness_weight", "created_at"
        )
    }
    first = dict(
        Attempt.objects.filter(namespace__name=namespace, claim_generation=1).values_list(
            "task_id", "started_at"
        )
    )
    grants = sorted((at, task_id) for task_id, at in first.items())
    violations = []
    for at, task_id in grants:
        mine = tasks[task_id].priority
        for other in tasks.values():
            if other.priority >= mine or other.created_at > at - MARGIN:
                continue
            taken = first.get(other.task_id)
            if taken is None or taken > at + MARGIN:
                violations.append(f"{task_id} (priority {mine}) at {at} while {other.task_id} waited")
                break
    worst, windows = float("-inf"), 0
    for priority in sorted({t.priority for t in tasks.values()}):
        order = [tasks[task_id] for _, task_id in grants if tasks[task_id].priority == priority]
        excess, checked = _worst_window(order, slack)
        worst, windows = max(worst, excess), windows + checked
    return OrderVerdict(len(grants), violations, worst, windows)


def _worst_window(order: list[Task], slack: float) -> tuple[float, int]:
    """Over each pair of keys, the prefix of ``order`` while both still had tasks to come (both waiting)."""
    weights = {t.fairness_key: t.fairness_weight for t in order}
    last = {t.fairness_key: i for i, t in enumerate(order)}
    worst, checked = float("-inf"), 0
    for f in weights:
        for g in weights:
            if f >= g:
                continue
            end = min(last[f], last[g])  # after this, one of them had nothing left waiting
            span = order[: end + 1]
            diffs = [0.0] + list(
                accumulate(
                    (1 / weights[f] if t.fairness_key == f else 0.0)
                    - (1 / weights[g] if t.fairness_key == g else 0.0)
                    for t in span
                )
            )
            bound = 1 / weights[f] + 1 / weights[g] + slack
            worst = max(worst, max(diffs) - min(diffs) - bound)
            checked += 1
    return worst, checked
