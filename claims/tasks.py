"""Celery jobs of the claim.v1 core. Thin: load by id, call one service, own only the retry policy."""

from __future__ import annotations

from celery import shared_task
from django.db import DatabaseError

from .locks import singleton
from .services import leases_reap
from .services.dispatch_delivery import dispatch_deliver, dispatch_stuck
from .services.metrics import metrics_fold
from .services.retention import history_prune
from .services.serving import serving_check


@shared_task(
    name="claims.deliver_dispatch",
    autoretry_for=(DatabaseError,),
    retry_backoff=True,
    retry_kwargs={"max_retries": 8},
    acks_late=True,
)
def deliver_dispatch(dispatch_id: str) -> dict:
    """Deliver a dispatch intent. Safe to run twice at once: only one runner takes the intent. The retry is for
    the database, never for the target — a timeout at the target is an UNKNOWN outcome, not a retry."""
    delivery = dispatch_deliver(dispatch_id=dispatch_id)
    return {"dispatch_id": delivery.dispatch_id, "sent": delivery.sent, "outcome": delivery.outcome}


@shared_task(name="claims.reap_expired_leases")
def reap_expired_leases() -> dict:
    """Periodic and a singleton (advisory lock): a second run at the same time does nothing."""
    with singleton("reap_expired_leases") as got:
        if not got:
            return {"skipped": "another run holds the lock"}
        return {"reaped": leases_reap()}  # the service owns its transaction


@shared_task(
    name="claims.check_serving",
    autoretry_for=(
        DatabaseError,
    ),  # it runs when the database is switching over: until the new leader answers
    retry_backoff=1,
    retry_backoff_max=10,
    retry_kwargs={"max_retries": 12},
)
def check_serving() -> dict:
    """Periodic: record the database's history if it changed (a failover; synchronous replication switched), and
    fence if it must — for the processes that answer no request, whose decisions wait on it (services.serving)."""
    row = serving_check()
    if row is None:
        return {"changed": False}
    return {"changed": True, "timeline": row.timeline, "synchronous": row.synchronous, "fenced": row.fenced}


@shared_task(name="claims.redeliver_dispatches")
def redeliver_dispatches() -> dict:
    """Periodic: re-enqueue deliveries a dead worker or a lost message left unfinished (same key)."""
    stuck = dispatch_stuck()
    for dispatch_id in stuck:
        deliver_dispatch.delay(dispatch_id)
    return {"redelivered": len(stuck)}


@shared_task(name="claims.fold_metrics")
def fold_metrics() -> dict:
    """Periodic: fold the records written since the last fold into /metrics' tallies (a singleton; a second fold
    at the same time would wait on the watermark row anyway, then find nothing to do)."""
    with singleton("fold_metrics") as got:
        if not got:
            return {"skipped": "another run holds the lock"}
        folded = metrics_fold()
        return {"through": folded.through.isoformat(), "figures": folded.figures}


@shared_task(name="claims.prune_history")
def prune_history() -> dict:
    """Periodic: retention (services.retention), in short batches for at most 60 s a run; what is left waits for
    the next run. A singleton: two runs would only race each other for the same rows."""
    with singleton("prune_history") as got:
        if not got:
            return {"skipped": "another run holds the lock"}
        return vars(history_prune(budget_seconds=60))
