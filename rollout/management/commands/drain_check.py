"""drain_check NAMESPACE [--pool POOL] — take a drain snapshot and print it."""

from __future__ import annotations

from django.core.management.base import BaseCommand

from claims.errors import ClaimError
from claims.management.commands._common import fail, show
from rollout.services.stages import drain_snapshot


class Command(BaseCommand):
    help = "Take a drain snapshot (live leases, UNKNOWN effects, staged results awaiting commit)."

    def add_arguments(self, parser):
        parser.add_argument("namespace")
        parser.add_argument("--pool", default=None)

    def handle(self, *args, namespace: str, pool: str | None, **options):
        try:
            snap = drain_snapshot(namespace=namespace, pool=pool)
        except ClaimError as exc:
            raise fail(exc) from None
        show(
            self.stdout,
            {
                "namespace": namespace,
                "pool": pool,
                "active_leases": snap.active_leases,
                "unknown_effects": snap.unknown_effects,
                "awaiting_commit": snap.awaiting_commit,
                "legacy_writes_pending": snap.legacy_writes_pending,
                "direct_writes": snap.direct_writes,
                "clean": snap.is_clean,
                "clean_streak": snap.clean_streak,
                "taken_at": snap.taken_at,
            },
        )
