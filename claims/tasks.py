"""Celery jobs of the claim.v1 core. Thin: load by id, call one service, own only the retry policy."""

from __future__ import annotations

from celery import shared_task
from django.db import DatabaseError

from .services.dispatch import dispatch_deliver


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
