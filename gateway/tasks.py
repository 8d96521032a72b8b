"""The gateway's Celery job. Thin: one service call."""

from __future__ import annotations

from celery import shared_task

from claims.locks import singleton

from .services import calls_sweep_lost


@shared_task(name="gateway.sweep_lost_calls")
def sweep_lost_calls() -> dict:
    """Periodic and a singleton: tool calls whose gateway process died mid-call recorded UNKNOWN, so the drain gate
    and the console count them at once (the slot's next call would find them too)."""
    with singleton("sweep_lost_calls") as got:
        if not got:
            return {"skipped": "another run holds the lock"}
        return {"lost": calls_sweep_lost()}
