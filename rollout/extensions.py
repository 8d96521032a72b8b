"""What the rollout adds to the on-call tools (``oncall.extensions``), registered when the app is ready: a
namespace's stage, rollback and mismatches on the overview and the incident header, the legacy API's live
claims in the drain figures and on the pools page, and the worker registrations as the pools page's rows."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Count, Min, Q
from django.urls import reverse

from claims.models import Namespace, Task
from claims.ui import task_note
from oncall import extensions
from oncall.selectors import Lease, age_seconds, live_tasks

from . import selectors
from .legacy import legacy_store
from .models import (
    DrainSnapshot,
    Mismatch,
    MismatchReason,
    MismatchStatus,
    ObserverPosition,
    Rollback,
    Stage,
    WorkerRegistration,
)


@extensions.namespace_facts
def rollout_facts(namespace: Namespace, now: datetime) -> dict[str, Any]:
    rollback = selectors.open_rollback(namespace.name)
    snapshot = selectors.last_snapshot(namespace.name)
    snapshot_age = age_seconds(snapshot.taken_at, now) if snapshot else None
    behind = []
    if snapshot is not None and selectors.snapshot_is_stale(snapshot, now):
        behind.append(f"the last drain check ran {snapshot_age:.0f} s ago")
    stage = selectors.stage_of(namespace)
    gate = selectors.last_gate(namespace, stage)
    return {
        "legacy_note": _legacy_note(namespace, stage, now),
        "stage": stage,
        "next_stage": selectors.next_stage(stage),
        # The gate out of the current stage as last recorded (only since the stage began), with its age.
        "gate": gate,
        "gate_age": age_seconds(gate.at, now) if gate else None,
        "rollback": rollback,
        "rollback_waits_on": selectors.drain_now(namespace) if rollback else None,
        "drain_stalled_for": _drain_stalled_for(rollback),
        "last_drain_check_age": snapshot_age,
        "jobs_behind": behind,
        **_unexplained(namespace, now),
    }


def _drain_stalled_for(rollback: Rollback | None) -> float | None:
    """How long an open rollback's drain has not moved: the seconds its outstanding work (live leases, UNKNOWN
    effects, staged results awaiting commit, in the whole namespace's snapshots since it began) has not gone down —
    ``None`` when no rollback is open, it is clean, or it moved within four drain intervals (a drain check or two
    may take its time)."""
    if rollback is None:
        return None
    snapshots = DrainSnapshot.objects.filter(
        namespace=rollback.namespace, pool="", taken_at__gte=rollback.started_at
    ).order_by("-taken_at", "-id")[:500]

    def outstanding(s: DrainSnapshot) -> int:
        return s.active_leases + s.unknown_effects + s.awaiting_commit

    latest, since = None, None
    for snapshot in snapshots:
        if latest is None:
            if not outstanding(snapshot):
                return None
            latest = snapshot
        elif outstanding(snapshot) > outstanding(latest):
            break  # it went down after this one
        since = snapshot.taken_at
    if latest is None or since is None:
        return None
    stalled = (latest.taken_at - since).total_seconds()
    return stalled if stalled >= 4 * settings.DRAIN_INTERVAL_SECONDS else None


def _unexplained(namespace: Namespace, now: datetime) -> dict[str, Any]:
    """The mismatches awaiting review: how many, how long the oldest has waited, and how many are a stale writer's
    commit accepted (the incident board puts these first)."""
    waiting = Mismatch.objects.filter(
        namespace=namespace.name, status__in=[MismatchStatus.OPEN, MismatchStatus.BUG]
    )
    figures = waiting.aggregate(
        n=Count("id"),
        oldest=Min("at"),
        stale=Count("id", filter=Q(reason=MismatchReason.STALE_COMMIT_ACCEPTED)),
    )
    return {
        "mismatches": figures["n"],
        "oldest_mismatch_age": age_seconds(figures["oldest"], now) if figures["oldest"] else None,
        "stale_writers": figures["stale"],
    }


def _legacy_note(namespace: Namespace, stage: str, now: datetime) -> str:
    """Where legacy decides, what a fence does not reach, said plainly beside the fence: legacy knows no epochs."""
    if stage not in (Stage.LEGACY, Stage.SHADOW, Stage.V1_READS):
        return ""
    held = len(legacy_leases(namespace, now, None))
    note = (
        f"Legacy decides in {stage} and knows no epochs: a fence ends claim.v1's leases, but legacy keeps its own "
        f"until they expire — {held} live in it now, and the drain waits for them. Proxy mode refuses old "
        "binaries' calls under a lease from before the fence (FENCED, EPOCH)."
    )
    if ObserverPosition.objects.exists():
        note += (
            " Observe mode cannot: old binaries that write your table directly are not refused — their leases "
            "from before the fence run on until they expire, and their writes are judged as they come."
        )
    return note


@task_note
def the_record_the_api_answers(task: Task) -> dict[str, Any] | None:
    """In LEGACY and SHADOW the API's task read answers legacy's record (``selectors.legacy_view``), which decides
    there; the console says so beside claim.v1's, and shows legacy's."""
    stage = selectors.stage_of(task.namespace)
    if stage not in selectors.LEGACY_READS:
        return None
    view = selectors.legacy_view(task)
    return {
        "store": "legacy",
        "why": f"In {stage} legacy decides: GET /api/v1/tasks/{task.task_id} answers legacy's record "
        "(read_from: legacy), not the claim.v1 record below.",
        "record": {
            "state": view.state,
            "owner": view.owner_id,
            "lease_expires_at": view.lease_expires_at,
            "result_digest": view.result_digest,
        },
    }


@extensions.namespace_pages
def rollout_pages(name: str) -> list[dict[str, str]]:
    return [
        {"label": "rollout", "href": reverse("console:rollout", args=[name])},
        {"label": "mismatches", "href": reverse("console:mismatches", args=[name])},
    ]


@extensions.extra_leases
def legacy_leases(namespace: Namespace, now: datetime, pool: str | None) -> list[Lease]:
    """Legacy's live leases, read from the legacy store (a team's own table through its adapter), once: not a claim
    that also lives in claim.v1 as the same owner's live attempt — counted there. Where legacy decides (LEGACY,
    SHADOW, V1_READS) every lease it holds counts, whoever it was granted to: after a fence claim.v1's attempt has
    ended, but legacy, which knows no epochs, keeps the lease until its own expiry — the drain waits for it. From
    V1_WRITES on, the rows claim.v1 wrote through are its own attempts: only legacy-API claims count."""
    v1_holders = set(live_tasks(namespace, now).values_list("task_id", "owner_id"))
    legacy_decides = selectors.stage_of(namespace) in (Stage.LEGACY, Stage.SHADOW, Stage.V1_READS)
    return [
        Lease(namespace.name, row.task_id, row.owner_id, row.pool, "legacy")
        for row in legacy_store().live_claims(namespace=namespace.name, now=now, pool=pool)
        if (legacy_decides or row.via == "legacy") and (row.task_id, row.owner_id) not in v1_holders
    ]


@extensions.worker_rows
def registrations(now: datetime, held: dict[tuple[str, str], int]) -> list[dict[str, Any]]:
    return [
        {
            "reg": reg,
            "held": held.get((reg.namespace, reg.principal), 0),
            "stale": selectors.worker_is_stale(reg, now),
        }
        for reg in WorkerRegistration.objects.order_by("namespace", "pool", "principal")
    ]
