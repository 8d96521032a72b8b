"""Stages, gates, drain snapshots, advance and rollback (rollout.md).

A stage moves forward one step at a time, only when its gate holds (or an oncall overrides with a reason). Every
gate evaluation is recorded with its figures. Rollback is oncall's: epoch fence → namespace-wide drain → stage
back → claims stay paused.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction

from claims import clock, services
from claims.errors import Conflict, Forbidden, InvalidTransition, NotFound
from claims.models import Namespace, Principal, Role, Stage

from . import selectors
from .legacy import legacy_store
from .models import CoverageWaiver, DrainSnapshot, GateEvaluation, Rollback, StageChange

ORDER = [Stage.LEGACY, Stage.SHADOW, Stage.V1_READS, Stage.V1_WRITES, Stage.V1_ONLY]


class GateNotMet(Conflict):
    outcome = "GATE_NOT_MET"


@dataclass(frozen=True)
class Gate:
    move: str
    holds: bool
    figures: dict[str, Any]
    why: str
    checked_at: Any


def next_stage(stage: str) -> str | None:
    index = ORDER.index(stage)
    return ORDER[index + 1] if index + 1 < len(ORDER) else None


def _namespace(name: str) -> Namespace:
    namespace = Namespace.objects.filter(name=name).first()
    if namespace is None:
        raise NotFound(f"no such namespace: {name}")
    return namespace


# --- drain ------------------------------------------------------------------------------------------------


def drain_snapshot(*, namespace: str, pool: str | None = None) -> DrainSnapshot:
    """Take a snapshot. Clean streak: +1 when this and the previous snapshot (of this stage) are clean and at
    least DRAIN_INTERVAL_SECONDS apart; kept when the previous is clean but too recent; reset by a dirty one."""
    ns = _namespace(namespace)
    with transaction.atomic(durable=True):
        now = clock.now()
        counts = selectors.drain_counts(ns, pool=pool, now=now)
        clean = not any(counts.values())
        previous = (
            DrainSnapshot.objects.select_for_update()
            .filter(namespace=ns.name, pool=pool or "", taken_at__gte=selectors.stage_started_at(ns))
            .order_by("-taken_at")
            .first()
        )
        if not clean:
            streak = 0
        elif previous is None or not previous.clean:
            streak = 1
        elif now - previous.taken_at >= timedelta(seconds=settings.DRAIN_INTERVAL_SECONDS):
            streak = previous.clean_streak + 1
        else:
            streak = previous.clean_streak
        return DrainSnapshot.objects.create(
            namespace=ns.name, pool=pool or "", clean=clean, clean_streak=streak, taken_at=now, **counts
        )


def drained(snapshot: DrainSnapshot) -> bool:
    """Two consecutive clean snapshots, the newer at most DRAIN_INTERVAL_SECONDS old."""
    fresh = clock.now() - snapshot.taken_at <= timedelta(seconds=settings.DRAIN_INTERVAL_SECONDS)
    return snapshot.clean and snapshot.clean_streak >= 2 and fresh


# --- gates ------------------------------------------------------------------------------------------------


def evaluate_gate(*, namespace: str) -> Gate | None:
    """Evaluate (and record) the gate of the namespace's next move; None at V1_ONLY."""
    ns = _namespace(namespace)
    to = next_stage(ns.stage)
    if to is None:
        return None
    now = clock.now()
    move = f"{ns.stage} → {to}"
    mismatches = selectors.mismatch_counts(ns)
    if ns.stage == Stage.LEGACY:
        workers = selectors.fresh_v1_workers(ns, now)
        figures = {"v1_workers": workers}
        holds, why = (
            workers >= 1,
            "a claim.v1 worker with a fresh heartbeat is registered"
            if workers
            else "no claim.v1 worker has registered for this namespace with a recent heartbeat",
        )
    elif ns.stage == Stage.SHADOW:
        compared = selectors.compared_count(ns, now)
        figures = {
            "compared": compared,
            "min_samples": settings.ROLLOUT_MIN_SAMPLES,
            "open_mismatches": mismatches["open"],
            "bug_mismatches": mismatches["bug"],
        }
        reasons = []
        if compared < settings.ROLLOUT_MIN_SAMPLES:
            reasons.append(
                f"only {compared} of {settings.ROLLOUT_MIN_SAMPLES} compared operations in the window"
            )
        if mismatches["open"] or mismatches["bug"]:
            reasons.append(f"{mismatches['open']} open and {mismatches['bug']} bug mismatches await review")
        holds, why = (
            not reasons,
            "; ".join(reasons) or "enough agreeing comparisons, every mismatch explained",
        )
    elif ns.stage == Stage.V1_READS:
        cov = selectors.coverage(ns, now)
        requests = sum(p["total"] for p in cov["points"].values())
        uncovered = [
            point
            for point, p in cov["points"].items()
            if not ((p["total"] and p["validated"] == p["total"]) or (p["total"] == 0 and p["waived"]))
        ]
        figures = {
            "points": {point: p["ratio"] for point, p in cov["points"].items()},
            "requests": requests,
            "min_samples": settings.ROLLOUT_MIN_COVERAGE_SAMPLES,
        }
        reasons = []
        if uncovered:
            reasons.append(f"not fully covered: {', '.join(uncovered)}")
        if requests < settings.ROLLOUT_MIN_COVERAGE_SAMPLES:
            reasons.append(
                f"only {requests} of {settings.ROLLOUT_MIN_COVERAGE_SAMPLES} requests in the window"
            )
        holds, why = not reasons, "; ".join(reasons) or "every acceptance point fully validated"
    else:  # V1_WRITES → V1_ONLY
        snapshot = drain_snapshot(namespace=ns.name, pool="legacy")
        figures = {
            "active_leases": snapshot.active_leases,
            "unknown_effects": snapshot.unknown_effects,
            "awaiting_commit": snapshot.awaiting_commit,
            "clean_streak": snapshot.clean_streak,
            "open_mismatches": mismatches["open"],
            "bug_mismatches": mismatches["bug"],
        }
        reasons = []
        if not drained(snapshot):
            reasons.append(
                "the legacy pool is not drained (two clean snapshots "
                f"{settings.DRAIN_INTERVAL_SECONDS}s apart needed; streak {snapshot.clean_streak})"
            )
        if mismatches["open"] or mismatches["bug"]:
            reasons.append(f"{mismatches['open']} open and {mismatches['bug']} bug mismatches await review")
        holds, why = not reasons, "; ".join(reasons) or "the legacy pool is drained"
    GateEvaluation.objects.create(namespace=ns.name, move=move, holds=holds, figures=figures, why=why, at=now)
    return Gate(move, holds, figures, why, now)


def _import_legacy_claims(ns: Namespace, principal: Principal) -> int:
    """Entering SHADOW: every live legacy claim becomes a claim.v1 attempt (generation + 1 each), so both
    stores start equal. Owners without a principal cannot hold claim.v1 attempts and are skipped (counted)."""
    imported = 0
    now = clock.now()
    for row in legacy_store().live_claims(namespace=ns.name, now=now):
        owner = Principal.objects.filter(name=row.owner_id, role=Role.WORKER).first()
        if owner is None:
            continue
        ttl = max(
            settings.LEASE_MIN_SECONDS,
            min(settings.LEASE_MAX_SECONDS, int((row.expires_at - now).total_seconds())),
        )
        try:
            with services.unvalidated():
                services.task_claim(
                    principal=owner,
                    task_id=row.task_id,
                    owner_id=owner.name,
                    scheduler_epoch=ns.scheduler_epoch,
                    ttl_seconds=ttl,
                )
            imported += 1
        except Conflict:
            continue
    return imported


def advance(
    *, principal: Principal, namespace: str, to_stage: str, reason: str, override: bool = False
) -> tuple[str, Gate]:
    """Move one step forward when the gate holds; an oncall override needs a reason and is recorded as one."""
    ns = _namespace(namespace)
    expected = next_stage(ns.stage)
    if to_stage != expected:
        raise InvalidTransition(
            f"from {ns.stage} the next stage is {expected}, not {to_stage}",
            current={"stage": ns.stage, "next_stage": expected},
        )
    if override and principal.role != Role.ONCALL:
        raise Forbidden("only oncall may override a gate")
    gate = evaluate_gate(namespace=namespace)
    if not gate.holds and not override:
        raise GateNotMet(gate.why, current={"gate": gate.move, "figures": gate.figures})
    services.namespace_set_stage(principal=principal, namespace=namespace, stage=to_stage, reason=reason)
    StageChange.objects.create(
        namespace=namespace,
        from_stage=ns.stage,
        to_stage=to_stage,
        principal=principal.name,
        reason=reason,
        override=override and not gate.holds,
        figures=gate.figures,
        at=clock.now(),
    )
    if ns.stage == Stage.LEGACY and to_stage == Stage.SHADOW:
        _import_legacy_claims(_namespace(namespace), principal)
    return to_stage, gate


def waive_coverage(*, principal: Principal, namespace: str, point: str, reason: str) -> CoverageWaiver:
    ns = _namespace(namespace)
    with transaction.atomic(durable=True):
        now = clock.now()
        waiver = CoverageWaiver.objects.create(
            namespace=ns.name, point=point, reason=reason, principal=principal.name, at=now
        )
        from claims.services._base import audit

        audit(
            principal=principal,
            action="coverage_waive",
            at=now,
            namespace=ns.name,
            target=point,
            reason=reason,
        )
    return waiver


# --- rollback ---------------------------------------------------------------------------------------------


def rollback(
    *, principal: Principal, namespace: str, to_stage: str, reason: str, force: bool = False
) -> Rollback:
    """Oncall's rollback to an earlier stage: (1) an epoch fence — claims paused, every attempt before it fenced;
    (2) a namespace-wide drain: done at the first clean snapshot after the fence (re-POST with force and a reason
    to finish anyway, recorded); (3) the stage moves back; (4) claims stay paused until someone resumes them."""
    if principal.role != Role.ONCALL:
        raise Forbidden("rollback is oncall's")
    ns = _namespace(namespace)
    running = Rollback.objects.filter(namespace=ns.name, finished_at__isnull=True).first()
    if running is None:
        if to_stage not in ORDER or ORDER.index(to_stage) >= ORDER.index(ns.stage):
            raise InvalidTransition(
                f"roll back from {ns.stage} to an earlier stage, not {to_stage}", current={"stage": ns.stage}
            )
        fenced = services.epoch_fence(principal=principal, namespace=ns.name, reason=f"rollback: {reason}")
        running = Rollback.objects.create(
            namespace=ns.name,
            from_stage=ns.stage,
            to_stage=to_stage,
            step="DRAINING",
            reason=reason,
            principal=principal.name,
            scheduler_epoch=fenced.scheduler_epoch,
            started_at=clock.now(),
        )
    return advance_rollback(rollback_id=running.pk, principal=principal, force=force, reason=reason)


def advance_rollback(
    *, rollback_id: Any, principal: Principal | None = None, force: bool = False, reason: str = ""
) -> Rollback:
    """Drive a rollback: take a namespace-wide drain snapshot; at the first clean one (or when forced) move the
    stage back and finish. Idempotent; the ``advance_rollback`` job calls it until done."""
    running = Rollback.objects.get(pk=rollback_id)
    if running.finished_at is not None:
        return running
    snapshot = drain_snapshot(namespace=running.namespace)
    if not snapshot.clean and not force:
        return running
    forced = force and not snapshot.clean
    # The stage moves first, then the rollback is marked done: a run killed in between leaves a running rollback
    # whose stage has already moved, and the next run (the job, every 15 s) finishes it. The other order could
    # leave a rollback marked DONE with the stage never moved back.
    if _namespace(running.namespace).stage != running.to_stage:
        services.namespace_set_stage(
            principal=principal,
            namespace=running.namespace,
            stage=running.to_stage,
            reason=f"rollback{' (forced: ' + reason + ')' if forced else ''}",
        )
    with transaction.atomic(durable=True):
        locked = Rollback.objects.select_for_update().get(pk=rollback_id)
        if locked.finished_at is not None:
            return locked
        locked.step, locked.finished_at, locked.forced = "DONE", clock.now(), forced
        locked.save(update_fields=["step", "finished_at", "forced"])
        StageChange.objects.create(
            namespace=running.namespace,
            from_stage=running.from_stage,
            to_stage=running.to_stage,
            principal=principal.name if principal else "system",
            reason=running.reason,
            override=forced,
            figures={
                "drain": {
                    "active_leases": snapshot.active_leases,
                    "unknown_effects": snapshot.unknown_effects,
                    "awaiting_commit": snapshot.awaiting_commit,
                }
            },
            at=locked.finished_at,
        )
    return locked
