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

from claims import clock, interleave, services
from claims.errors import ClaimsPaused, Forbidden, InvalidTransition
from claims.models import Namespace, Principal, Role
from claims.selectors import fence_epoch_of
from claims.validation import all_of, one_of, real_text

from .. import selectors
from ..models import CoverageWaiver, DrainSnapshot, GateEvaluation, Rollback, RollbackStep, Stage, StageChange
from . import adoption, state, write_through
from .errors import GateNotMet, RollbackInProgress


@dataclass(frozen=True)
class Gate:
    move: str
    holds: bool
    figures: dict[str, Any]
    why: str
    checked_at: Any


# --- drain ------------------------------------------------------------------------------------------------


def drain_snapshot(*, namespace: str, pool: str | None = None) -> DrainSnapshot:
    """Take a snapshot (its own transaction)."""
    ns = selectors.namespace_or_404(namespace)
    with transaction.atomic(durable=True):
        return _snapshot(ns, pool=pool, now=clock.now())


def _snapshot(ns: Namespace, *, pool: str | None, now: Any) -> DrainSnapshot:
    """A snapshot inside the caller's transaction. Clean streak: +1 when this and the previous snapshot (of this
    stage) are clean and at least DRAIN_INTERVAL_SECONDS apart; kept when the previous is clean but too recent;
    reset by a dirty one. The previous snapshot is locked, so two snapshots at once do not both count it."""
    with transaction.atomic(savepoint=False):
        counts = {
            **selectors.drain_counts(ns, pool=pool, now=now),
            "legacy_writes_pending": selectors.legacy_writes_pending(ns.name),
            "direct_writes": selectors.direct_writes_open(ns.name),
        }
        clean = not any(counts.values())
        previous = (
            DrainSnapshot.objects.select_for_update()
            .filter(namespace=ns.name, pool=pool or "", taken_at__gte=selectors.stage_started_at(ns))
            .order_by("-taken_at")
            .first()
        )
        if not clean:
            streak = 0
        elif previous is None or not previous.is_clean:
            streak = 1
        elif now - previous.taken_at >= timedelta(seconds=settings.DRAIN_INTERVAL_SECONDS):
            streak = previous.clean_streak + 1
        else:
            streak = previous.clean_streak
        return DrainSnapshot.objects.create(
            namespace=ns.name, pool=pool or "", is_clean=clean, clean_streak=streak, taken_at=now, **counts
        )


def drained(snapshot: DrainSnapshot) -> bool:
    """Two consecutive clean snapshots, the newer at most DRAIN_INTERVAL_SECONDS old."""
    fresh = clock.now() - snapshot.taken_at <= timedelta(seconds=settings.DRAIN_INTERVAL_SECONDS)
    return snapshot.is_clean and snapshot.clean_streak >= 2 and fresh


# --- gates ------------------------------------------------------------------------------------------------


def evaluate_gate(*, namespace: str) -> Gate | None:
    """Evaluate and record the gate of the namespace's next move (the ``gate_check`` job; reads show the last
    recorded one, ``selectors.last_gate``); None at V1_ONLY.

    The stage (and the namespace's epoch, which the drain figures use) is read under the namespace row's FOR SHARE
    lock, and the clock after it: an advance or rollback (NO KEY UPDATE) waits until the evaluation is recorded,
    so no evaluation is filed under a stage that had already ended."""
    ns = selectors.namespace_or_404(namespace)
    with transaction.atomic(durable=True):
        held = state.hold_for_decision(ns.id)
        ns = selectors.namespace_or_404(namespace)  # as the lock keeps it
        interleave.reach("evaluate_gate.held")
        return _evaluate(ns, held.stage, now=clock.now())


def _evaluate(ns: Namespace, stage: str, *, now: Any) -> Gate | None:
    """The gate of ``ns``'s next move from ``stage``, recorded with its figures inside the caller's
    transaction."""
    to = selectors.next_stage(stage)
    if to is None:
        return None
    move = f"{stage} → {to}"
    mismatches = selectors.mismatch_counts(ns)
    figures: dict[str, Any]
    if stage == Stage.LEGACY:
        workers = selectors.fresh_v1_workers(ns, now)
        figures = {"v1_workers": workers}
        holds, why = (
            workers >= 1,
            "a claim.v1 worker with a fresh heartbeat is registered"
            if workers
            else "no claim.v1 worker has registered for this namespace with a recent heartbeat",
        )
    elif stage == Stage.SHADOW:
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
    elif stage == Stage.V1_READS:
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
        figures, holds, why = _drain_gate(ns, now, mismatches)
    GateEvaluation.objects.create(namespace=ns.name, move=move, holds=holds, figures=figures, why=why, at=now)
    return Gate(move, holds, figures, why, now)


def _drain_gate(ns: Namespace, now: Any, mismatches: dict[str, int]) -> tuple[dict[str, Any], bool, str]:
    """V1_WRITES → V1_ONLY: the legacy pool drained (two clean snapshots) and no mismatch awaiting review."""
    snapshot = _snapshot(ns, pool="legacy", now=now)
    figures = {
        **drain_figures(snapshot),
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
    return figures, not reasons, "; ".join(reasons) or "the legacy pool is drained"


def drain_figures(snapshot: DrainSnapshot) -> dict[str, int]:
    """A drain snapshot's counts (its ``clean`` is that they are all 0)."""
    return {
        "active_leases": snapshot.active_leases,
        "unknown_effects": snapshot.unknown_effects,
        "awaiting_commit": snapshot.awaiting_commit,
        "legacy_writes_pending": snapshot.legacy_writes_pending,
        "direct_writes": snapshot.direct_writes,
    }


def _open_rollback(namespace: str) -> Rollback | None:
    return Rollback.objects.filter(namespace=namespace, finished_at__isnull=True).first()


def advance(
    *, principal: Principal, namespace: str, to_stage: str, reason: str, override: bool = False
) -> tuple[str, Gate]:
    """Move one step forward when the gate holds; an oncall override needs a reason and is recorded as one.

    One transaction, decided on what the namespace row lock keeps still (the lock every stage change, fence,
    resume and rollback start takes first):
    1. Lock the namespace row FOR NO KEY UPDATE; read the clock after it.
    2. A rollback open on the namespace: ROLLBACK_IN_PROGRESS — an advance never races a rollback's stage move,
       override or not. ``to_stage`` not the next stage from the stage read under the lock: INVALID_TRANSITION.
       Entering SHADOW while claims are paused: CLAIMS_PAUSED (the import of the live legacy claims would grant
       nothing, and the stores would not start equal).
    3. Evaluate the gate on the figures read now, and record the evaluation.
    4. The stage write is a compare-and-set on the stage read in 1, with its StageChange record.
    A refused gate still records its evaluation (the transaction commits it) and then answers GATE_NOT_MET.
    Entering SHADOW then imports the live legacy claims, and records what it imported and skipped (audited);
    over a team's table, first its rows as tasks — a job (``rollout.import_legacy_rows``) with its progress
    recorded (``LegacyImport``), since a table may hold millions.
    """
    if override and principal.role != Role.ONCALL:
        raise Forbidden("only oncall may override a gate")
    to_stage, reason = all_of(
        lambda: one_of(to_stage, Stage.values, field="to_stage"),
        lambda: (
            real_text(reason, why="An override needs a reason: it moves the stage with the gate shut.")
            if override
            else (reason or "").strip()
        ),
    )
    with transaction.atomic(durable=True):
        locked = state.lock(name=namespace)
        hold, stage = locked.hold, locked.stage
        if (running := _open_rollback(hold.name)) is not None:
            raise RollbackInProgress(
                f"a rollback to {running.to_stage} is under way ({running.step}): advance once it has ended",
                current={
                    "stage": stage,
                    "rollback": {"to_stage": running.to_stage, "step": running.step},
                },
            )
        expected = selectors.next_stage(stage)
        if to_stage != expected:
            raise InvalidTransition(
                f"from {stage} the next stage is {expected}, not {to_stage}",
                current={"stage": stage, "next_stage": expected},
            )
        if to_stage == Stage.SHADOW and hold.claims_paused:
            raise ClaimsPaused(
                "claims are paused: entering SHADOW imports the live legacy claims as claim.v1 attempts, which a "
                "paused namespace cannot grant. Resume claims first.",
                current={"stage": stage, "claims_paused": True, "scheduler_epoch": hold.scheduler_epoch},
            )
        ns = Namespace.objects.get(pk=hold.id)
        gate = _evaluate(ns, stage, now=hold.now)
        assert gate is not None  # a next stage exists (checked above)
        interleave.reach("rollout_advance.gated")
        if gate.holds or override:
            move = "forward" if gate.holds else "override"
            state.set_stage(locked, principal=principal, stage=to_stage, move=move, reason=reason)
            StageChange.objects.create(
                namespace=namespace,
                from_stage=stage,
                to_stage=to_stage,
                principal=principal.name,
                reason=reason,
                override=override and not gate.holds,
                figures=gate.figures,
                at=hold.now,
            )
    if not gate.holds and not override:
        raise GateNotMet(gate.why, current={"gate": gate.move, "figures": gate.figures})
    if stage == Stage.LEGACY and to_stage == Stage.SHADOW:
        if adoption.imports_rows():  # their table's rows become tasks, then its live claims attempts: a job
            started = adoption.start(namespace=namespace, principal=principal)
            transaction.on_commit(lambda: _enqueue_import(started.pk))
        else:
            adoption.import_legacy_claims(selectors.namespace_or_404(namespace), principal)
    return to_stage, gate


def _enqueue_import(import_id: int) -> None:
    services.enqueue("rollout.import_legacy_rows", import_id)  # the job by its name: jobs call services


def waive_coverage(*, principal: Principal, namespace: str, point: str, reason: str) -> CoverageWaiver:
    """Waive an acceptance point with no traffic in the window — counted by the V1_READS → V1_WRITES gate only, so
    refused in any other stage (its gate has no coverage condition to waive)."""
    point, reason = all_of(
        lambda: one_of(point, selectors.POINTS, field="point"),
        lambda: real_text(
            reason, why="A waiver needs a reason: it lets the gate pass without that point's traffic."
        ),
    )
    with transaction.atomic(durable=True):
        # Decided on the stage read under the namespace row lock every stage change takes first, clock after it.
        locked = state.lock(name=namespace)
        if locked.stage != Stage.V1_READS:
            raise InvalidTransition(
                f"coverage counts only in the gate out of V1_READS; {namespace} is in {locked.stage}, whose gate "
                "has no coverage condition to waive",
                current={"stage": locked.stage},
            )
        waiver = CoverageWaiver.objects.create(
            namespace=locked.hold.name,
            point=point,
            reason=reason,
            principal=principal.name,
            at=locked.hold.now,
        )
        locked.hold.audit(principal, "coverage_waive", target=point, reason=reason)
    return waiver


# --- rollback ---------------------------------------------------------------------------------------------


def rollback(
    *, principal: Principal, namespace: str, to_stage: str, reason: str, force: bool = False
) -> Rollback:
    """Oncall's rollback to an earlier stage: (1) an epoch fence — claims paused, every attempt before it fenced,
    and the pause held by this rollback (resume is refused until it ends); (2) a namespace-wide drain: done at
    the first clean snapshot after the fence (re-POST with force and a reason to finish anyway, recorded); (3) the
    stage moves back; (4) claims stay paused until someone resumes them.

    The rollback is recorded under the namespace row lock (FOR NO KEY UPDATE, taken first), so it and an advance
    are ordered: an advance after it is refused (ROLLBACK_IN_PROGRESS), one before it is what it rolls back. A
    second request while one is open checks the drain again: it finishes the open one when the drain is clean (or
    it forces, with the same target), and is otherwise refused — ROLLBACK_IN_PROGRESS with the open one's step, as
    is one naming another target: it never answers as if it had started something."""
    if principal.role != Role.ONCALL:
        raise Forbidden("rollback is oncall's")
    to_stage, reason = all_of(
        lambda: one_of(to_stage, [s for s in Stage.values if s != Stage.V1_ONLY], field="to_stage"),
        lambda: real_text(
            reason,
            why="A rollback needs a reason: it fences every worker of the namespace"
            + (" and, forced, finishes without a clean drain." if force else "."),
        ),
    )
    with transaction.atomic(durable=True):
        locked = state.lock(name=namespace)
        hold = locked.hold
        running = (
            Rollback.objects.select_for_update().filter(namespace=hold.name, finished_at__isnull=True).first()
        )
        if running is not None and to_stage != running.to_stage:
            raise _in_progress(running, locked.stage)
        again = running is not None
        if running is None:
            order = selectors.ORDER
            if to_stage not in order or order.index(to_stage) >= order.index(locked.stage):
                raise InvalidTransition(
                    f"roll back from {locked.stage} to an earlier stage, not {to_stage}",
                    current={"stage": locked.stage},
                )
            running = Rollback.objects.create(
                namespace=hold.name,
                from_stage=locked.stage,
                to_stage=to_stage,
                step=RollbackStep.FENCING,
                reason=reason,
                principal=principal.name,
                scheduler_epoch=hold.scheduler_epoch,
                started_at=hold.now,
            )
            hold.audit(
                principal,
                "rollback_start",
                target=f"rollback:{running.pk}",
                reason=reason,
                detail={"from": locked.stage, "to": to_stage},
            )
    done = advance_rollback(rollback_id=running.pk, principal=principal, force=force, reason=reason)
    if again and done.finished_at is None:
        raise _in_progress(done, done.from_stage)  # checked again, still draining: nothing was started
    return done


def _in_progress(running: Rollback, stage: str) -> RollbackInProgress:
    return RollbackInProgress(
        f"a rollback to {running.to_stage} is under way ({running.step}), asked by {running.principal}: it "
        "finishes at the first clean drain; to finish it now, send the same rollback with force and a reason",
        current={
            "stage": stage,
            "rollback": {
                "to_stage": running.to_stage,
                "step": running.step,
                "principal": running.principal,
                "started_at": running.started_at.isoformat(),
            },
        },
    )


def _hold_of(rollback: Rollback) -> str:
    return f"rollback:{rollback.pk}"


def _fence_for(rollback: Rollback) -> None:
    """Step 1, idempotent on the rollback's id (a run killed after the fence finds it recorded)."""
    actor = Principal.objects.get(name=rollback.principal)
    services.epoch_fence(
        principal=actor,
        namespace=rollback.namespace,
        reason=f"rollback: {rollback.reason}",
        fence_id=rollback.pk,
        hold=_hold_of(rollback),
    )
    Rollback.objects.filter(pk=rollback.pk, step=RollbackStep.FENCING).update(
        step=RollbackStep.DRAINING, scheduler_epoch=fence_epoch_of(rollback.pk)
    )


# Stages in which claim.v1 decides and legacy only follows (or, in V1_ONLY, is no longer written).
LEGACY_WRITTEN_BY_V1 = (Stage.V1_WRITES, Stage.V1_ONLY)


def advance_rollback(
    *, rollback_id: Any, principal: Principal | None = None, force: bool = False, reason: str = ""
) -> Rollback:
    """Drive a rollback: fence (once), take a namespace-wide drain snapshot; at the first clean one (or when
    forced) move the stage back and finish. Idempotent; the ``advance_rollback`` job calls it until done.

    The finish is one transaction under the namespace row lock: the stage's compare-and-set back, the pause hold
    released (claims stay paused), the rollback marked done, its StageChange.
    """
    running = Rollback.objects.get(pk=rollback_id)
    if running.finished_at is not None:
        return running
    if running.step == RollbackStep.FENCING:
        _fence_for(running)
        running.refresh_from_db()
    # claim.v1's decisions written through to a legacy table in another database, before legacy decides again;
    # what cannot be applied now keeps the drain from being clean (services/write_through.py)
    write_through.apply_pending(namespace=running.namespace)
    snapshot = drain_snapshot(namespace=running.namespace)
    if not snapshot.is_clean and not force:
        return running
    forced = force and not snapshot.is_clean
    if running.from_stage in LEGACY_WRITTEN_BY_V1:
        # back towards legacy: its table first made to match claim.v1 (a failure leaves the rollback open)
        write_through.write_back(namespace=running.namespace, rollback_id=running.pk)
    with transaction.atomic(durable=True):
        at = state.lock(name=running.namespace)
        hold = at.hold
        locked = Rollback.objects.select_for_update().get(pk=rollback_id)
        if locked.finished_at is not None:
            return locked
        # An advance is refused while the rollback is open, so the stage is still the one it started from — or,
        # for a rollback begun before the finish was one transaction, already moved back.
        # The one who asked for the rollback answers for its move, whether a request or the job drives it here.
        actor = principal or Principal.objects.get(name=locked.principal)
        if at.stage != locked.to_stage:
            state.set_stage(
                at,
                principal=actor,
                stage=locked.to_stage,
                move="rollback",
                reason=f"rollback: {locked.reason}{' (forced: ' + reason + ')' if forced else ''}",
            )
        services.namespace_release_hold(namespace=locked.namespace, hold=_hold_of(locked))
        locked.step, locked.finished_at, locked.forced = RollbackStep.DONE, hold.now, forced
        locked.save(update_fields=["step", "finished_at", "forced"])
        StageChange.objects.create(
            namespace=locked.namespace,
            from_stage=locked.from_stage,
            to_stage=locked.to_stage,
            principal=actor.name,
            reason=locked.reason,
            override=forced,
            figures={"drain": drain_figures(snapshot)},
            at=hold.now,
        )
    return locked
