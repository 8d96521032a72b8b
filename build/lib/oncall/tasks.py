"""The on-call tools' Celery jobs. Thin: load, call one service, own the retry policy."""

from __future__ import annotations

from celery import shared_task
from django.db import DatabaseError

from claims.models import Principal

from . import services

_RETRY = {"autoretry_for": (DatabaseError,), "retry_backoff": True, "retry_kwargs": {"max_retries": 5}}


@shared_task(name="oncall.fence_epoch", **_RETRY)
def fence_epoch(namespace: str, reason: str, principal: str, fence_id: str | None = None) -> dict:
    """Prove a fence: an old-epoch commit must come back FENCED (EPOCH). With the id of a recorded request (the
    console's path: the fence was made in its request) it runs that request's self-check, once however often it is
    sent; without one, it fences first (pause, bump, record) and then checks."""
    if fence_id is None:
        done = services.fence_now(
            principal=Principal.objects.get(name=principal), namespace=namespace, reason=reason
        )
    else:
        done = services.fence_check(fence_id=fence_id)
    return done.summary()


@shared_task(name="oncall.resend_fences")
def resend_fences() -> dict:
    """Periodic: send again the self-checks a dead worker or a lost message left unfinished."""
    pending = services.fences_unfinished()
    for request in pending:
        fence_epoch.delay(request.namespace, request.reason, request.principal, str(request.fence_id))
    return {"resent": len(pending)}
