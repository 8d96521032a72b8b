"""Rollout's Celery jobs (rollout.md). Thin: load, call one service, own the retry policy. Idempotent; those that
must run alone take a named advisory lock (claims.locks.singleton)."""

from __future__ import annotations

from typing import Any

from celery import shared_task
from django.conf import settings
from django.db import DatabaseError

from claims.locks import singleton
from claims.models import Namespace

from .models import Rollback, Stage
from .services import adoption, jobs, legacy_decisions, observers, stages, write_through
from .services.retention import rollout_history_prune

_RETRY = {"autoretry_for": (DatabaseError,), "retry_backoff": True, "retry_kwargs": {"max_retries": 5}}


@shared_task(name="rollout.drain_check", **_RETRY)
def drain_check(namespace: str | None = None, pool: str | None = None) -> list[dict]:
    """A drain snapshot per namespace that is migrating (or the one named); periodic and on demand."""
    names = (
        [namespace]
        if namespace
        else list(
            Namespace.objects.filter(
                rollout__stage__in=[Stage.SHADOW, Stage.V1_READS, Stage.V1_WRITES]
            ).values_list("name", flat=True)
        )
    )
    out = []
    for name in names:
        snapshot = stages.drain_snapshot(namespace=name, pool=pool)
        out.append({"namespace": name, "clean": snapshot.is_clean, "clean_streak": snapshot.clean_streak})
    return out


@shared_task(name="rollout.apply_legacy_writes", **_RETRY)
def apply_legacy_writes(namespace: str | None = None) -> dict[str, Any]:
    """Periodic: V1_WRITES' write-through to a legacy table in another database, what the requests left
    (services/write_through.py): retried every run until applied."""
    done = write_through.apply_pending(namespace=namespace)
    return {"applied": done.applied, "missing": done.missing, "failed": done.failed, "errors": done.errors}


@shared_task(name="rollout.settle_legacy_decisions", **_RETRY)
def settle_legacy_decisions(namespace: str | None = None) -> dict[str, int]:
    """Periodic: legacy decisions in another database whose commit there was never seen, judged from that table
    (services/legacy_decisions.py); claim.v1's shadow of a grant that never happened released."""
    with singleton("settle_legacy_decisions") as got:
        if not got:
            return {"skipped": 1}
        return legacy_decisions.resolve_open(namespace=namespace)


@shared_task(name="rollout.import_legacy_rows", **_RETRY)
def import_legacy_rows(import_id: int) -> dict[str, Any]:
    """Entering SHADOW over a team's table: its rows made tasks in batches, then its live claims
    (services/adoption.py). Resumes where a killed run stopped; alone per import."""
    with singleton(f"import_legacy_rows:{import_id}") as got:
        if not got:
            return {"skipped": 1}
        job = adoption.run(import_id)
        return {"read": job.read, "created": job.created, "claims": job.claims}


@shared_task(name="rollout.observe_legacy", **_RETRY)
def observe_legacy(limit: int = 1000) -> dict[str, Any]:
    """Periodic, where ROLLOUT_LEGACY_OBSERVE is on: one pass of observe mode (services/observers.py), alone."""
    if not settings.ROLLOUT_LEGACY_OBSERVE:
        return {"skipped": 1}
    return observers.once(limit=limit)


@shared_task(name="rollout.gate_check", **_RETRY)
def gate_check(namespace: str | None = None) -> list[dict]:
    """Periodic: evaluate and record the next move's gate of every namespace that has one (or the one named) —
    what the rollout page and GET …/rollout show, with its age. A read never evaluates."""
    names = (
        [namespace]
        if namespace
        else list(
            Namespace.objects.exclude(rollout__stage=Stage.V1_ONLY)
            .exclude(rollout__isnull=True)
            .values_list("name", flat=True)
        )
    )
    out = []
    for name in names:
        gate = stages.evaluate_gate(namespace=name)
        if gate is not None:
            out.append({"namespace": name, "move": gate.move, "holds": gate.holds})
    return out


@shared_task(name="rollout.compare_shadow", **_RETRY)
def compare_shadow(namespace: str | None = None) -> dict:
    with singleton("compare_shadow") as got:
        if not got:
            return {"skipped": "another run holds the lock"}
        return {"recorded": jobs.settle_winner_differs(namespace=namespace)}


@shared_task(name="rollout.advance_rollback", **_RETRY)
def advance_rollback(rollback_id: str | None = None) -> list[dict]:
    """Drive running rollbacks through their drain (the one named, or every running one)."""
    ids: list[Any] = (
        [rollback_id]
        if rollback_id
        else list(Rollback.objects.filter(finished_at__isnull=True).values_list("pk", flat=True))
    )
    out = []
    for pk in ids:
        rollback = stages.advance_rollback(rollback_id=pk)
        out.append({"rollback_id": str(pk), "step": rollback.step})
    return out


@shared_task(name="rollout.prune_history")
def prune_history() -> dict:
    """Periodic: the rollout's retention (services.retention), in short batches for at most 60 s a run."""
    with singleton("rollout_prune_history") as got:
        if not got:
            return {"skipped": "another run holds the lock"}
        return rollout_history_prune(budget_seconds=60)
