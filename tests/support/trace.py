"""Trace validation (issue 39, 2): a run's recorded task timelines replayed against the Spin model of the claim
rules (model/trace.pml), as etcd's raft and CCF check their traces against their specifications.

The events are the database's own records — every grant, renew, release, commit, cancel and requeue on a task's
timeline, and every epoch fence in the audit log — each with the clock its decision was made on and, for a grant or
a renew, the lease's new end. They are replayed in the order of those clocks (the locks make it the order the
decisions were made in). Namespaces whose timeline holds decisions another protocol made (the rollout's legacy
stages: ``via``) are left out; their rules are legacy's.

``replay(events)`` generates Spin's verifier for the model, runs it along the one path the events make, and answers
which event, if any, the rules do not allow.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

MODEL = Path(__file__).resolve().parents[2] / "model" / "trace.pml"

KINDS = {
    "claimed": 1,
    "reclaimed": 1,
    "renewed": 2,
    "result_committed": 3,
    "released": 4,
    "fence": 5,
    "cancelled": 6,
    "requeued": 7,
    "task_created": 8,
    "unblocked": 8,
}

_EVENTS = """
SELECT e.kind, e.task_id, n.name, e.claim_generation, e.scheduler_epoch, e.at, e.detail, e.id
FROM claims_taskevent e JOIN claims_namespace n ON n.id = e.namespace_id
WHERE e.kind IN ('task_created', 'unblocked', 'claimed', 'reclaimed', 'renewed', 'result_committed', 'released',
                 'cancelled', 'requeued')
  AND n.id NOT IN (SELECT namespace_id FROM claims_taskevent WHERE via <> '')
"""
_FENCES = """
SELECT 'fence', '', a.namespace, NULL, a.detail, a.at, a.id FROM claims_auditentry a
WHERE a.action IN ('epoch_fence', 'failover_fence')
"""


@dataclass(frozen=True)
class Event:
    kind: str
    task: str
    namespace: str
    generation: int
    epoch: int
    at: datetime
    lease: datetime | None

    def line(self) -> str:
        return f"{self.kind} {self.task or '-'} g{self.generation} e{self.epoch} at {self.at.isoformat()}"


@dataclass(frozen=True)
class Verdict:
    events: int
    rejected: int | None  # the index of the first event the rules do not allow
    seconds: float
    why: str = ""

    @property
    def explained(self) -> bool:
        return self.rejected is None


def _detail(value: Any) -> dict:
    return json.loads(value) if isinstance(value, str) else (value or {})


def _instant(value: Any) -> datetime:
    """A clock as the database answered it: aware on PostgreSQL; on SQLite a naive UTC value (or its text)."""
    instant = datetime.fromisoformat(value) if isinstance(value, str) else value
    return instant if instant.tzinfo else instant.replace(tzinfo=UTC)


def recorded(query: Callable[[str], list[tuple]]) -> list[Event]:
    """The run's events from its database (``query``: SQL → rows, on whichever connection reaches it)."""
    events = []
    for kind, task, namespace, generation, epoch, at, detail, _ in query(_EVENTS):
        lease = _detail(detail).get("lease_expires_at")
        events.append(
            Event(
                kind,
                task,
                namespace,
                generation or 0,
                epoch or 0,
                _instant(at),
                _instant(lease) if lease else None,
            )
        )
    for _, _, namespace, _, detail, at, _ in query(_FENCES):
        events.append(
            Event("fence", "", namespace, 0, int(_detail(detail)["scheduler_epoch"]), _instant(at), None)
        )
    # The order the decisions were made in; at one instant, a fence before the grants it let through.
    return sorted(events, key=lambda e: (e.at, e.kind != "fence"))


def replay(events: list[Event]) -> Verdict:
    """Replay ``events`` against model/trace.pml: Spin's verifier, generated for their tasks and namespaces, along
    the one path they make."""
    if shutil.which("spin") is None or shutil.which("gcc") is None:
        raise RuntimeError("needs Debian's spin and gcc (.ci/run installs spin: apt-get install spin)")
    started = time.monotonic()
    if not events:
        return Verdict(0, None, 0.0)
    # The rules compare times within a task only (its lease against its own events' clocks): each task's clock
    # counts from its first event, in microseconds, so a long run fits Promela's 32-bit int as long as each task's
    # own history is shorter than 35 minutes.
    origin: dict[str, datetime] = {}
    for e in events:
        if e.kind != "fence":
            origin.setdefault(e.task, e.at)
    tasks: dict[str, int] = {}
    namespaces: dict[str, int] = {}

    def us(e: Event, instant: datetime | None) -> int:
        if instant is None or e.kind == "fence":
            return 0
        value = int((instant - origin[e.task]).total_seconds() * 1_000_000)
        assert value < 2**31, f"task {e.task}'s history is longer than 35 minutes"
        return value

    rows = [str(len(events))]
    for e in events:
        t = tasks.setdefault(e.task, len(tasks)) if e.kind != "fence" else 0
        n = namespaces.setdefault(e.namespace, len(namespaces))
        rows.append(f"{KINDS[e.kind]} {t} {n} {e.generation} {e.epoch} {us(e, e.at)} {us(e, e.lease)}")
    with tempfile.TemporaryDirectory(prefix="trace-") as folder:
        work = Path(folder)
        shutil.copy(MODEL, work / "trace.pml")
        (work / "events.txt").write_text("\n".join(rows) + "\n")
        sizes = [f"-DNT={max(1, len(tasks))}", f"-DNS={max(1, len(namespaces))}"]
        subprocess.run(["spin", *sizes, "-a", "trace.pml"], cwd=work, check=True, capture_output=True)
        subprocess.run(
            ["gcc", "-O1", "-DSAFETY", "-DNOCLAIM", "-DNOFAIR", "-o", "pan", "pan.c"],
            cwd=work,
            check=True,
            capture_output=True,
        )
        done = subprocess.run(
            ["./pan", f"-m{20 * len(events) + 1000}"], cwd=work, capture_output=True, text=True, timeout=600
        )
    out = done.stdout + done.stderr
    seconds = time.monotonic() - started
    if f"ACCEPTED {len(events)}" in out and "errors: 0" in out:
        return Verdict(len(events), None, seconds)
    for line in out.splitlines():
        if line.strip().startswith("REJECT "):
            index = int(line.split()[1])
            return Verdict(len(events), index, seconds, events[index].line())
    raise RuntimeError(f"the verifier gave no verdict:\n{out[-3000:]}")


def assert_explained(query: Callable[[str], list[tuple]]) -> Verdict:
    """The run's recorded history is one the rules explain (every event a step they allow)."""
    events = recorded(query)
    verdict = replay(events)
    if not verdict.explained:
        assert verdict.rejected is not None
        context = "\n".join(e.line() for e in events[max(0, verdict.rejected - 8) : verdict.rejected + 1])
        raise AssertionError(f"event {verdict.rejected} is not a step the rules allow:\n{context}")
    return verdict


def a_grant_inside_a_live_lease(events: list[Event]) -> list[Event]:
    """A wrong event to inject: another grant of a task while its last grant's lease is live."""
    index, grant = next(
        (i, e)
        for i, e in enumerate(events)
        if e.kind in ("claimed", "reclaimed") and e.lease and e.lease > e.at
    )
    at = grant.at + (grant.lease - grant.at) / 2
    wrong = replace(
        grant, kind="reclaimed", generation=grant.generation + 1, at=at, lease=grant.lease + (at - grant.at)
    )
    return sorted(events + [wrong], key=lambda e: (e.at, e.kind != "fence"))


def a_commit_on_an_old_generation(events: list[Event]) -> list[Event]:
    """A wrong event to inject: a commit carrying a generation older than the task's latest grant."""
    grants: dict[str, list[Event]] = {}
    for e in events:
        if e.kind in ("claimed", "reclaimed"):
            grants.setdefault(e.task, []).append(e)
    task, seq = next((t, g) for t, g in grants.items() if len(g) >= 2)
    late = seq[-1]
    wrong = replace(seq[0], kind="result_committed", at=late.at + (late.lease - late.at) / 4, lease=None)
    return sorted(events + [wrong], key=lambda e: (e.at, e.kind != "fence"))
