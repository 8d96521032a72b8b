"""The legacy claim store behind a small adapter interface.

``LegacyStore`` is what the rollout needs from today's claim table; ``DjangoLegacyStore`` reproduces its naive
semantics faithfully on ``rollout.LegacyClaim``: a claim is owner + expires_at, after expiry anyone takes over,
a heartbeat or release by the named owner succeeds, and ``complete`` writes the result without checking who
holds the claim now — last write wins. (Each operation is atomic — we reproduce the protocol's semantics, not
its implementation's races.)

To run the migration against an existing table, implement ``LegacyStore`` over it (a raw-SQL adapter over
``claims(task_id, owner_id, expires_at, result)`` is ~60 lines) and set ``ROLLOUT_LEGACY_STORE`` to its dotted
path; see docs/rollout.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any, Protocol

from django.conf import settings
from django.utils.module_loading import import_string

from .models import LegacyClaim


@dataclass(frozen=True)
class LegacyVerdict:
    accepted: bool
    word: str  # GRANTED | HELD | RENEWED | RELEASED | NOT_OWNER | COMPLETED
    owner_id: str
    expires_at: datetime | None


class LegacyStore(Protocol):
    def claim(
        self,
        *,
        task_id: str,
        namespace: str,
        owner_id: str,
        ttl_seconds: int,
        now: datetime,
        pool: str = "",
        via: str = "legacy",
    ) -> LegacyVerdict: ...

    def heartbeat(self, *, task_id: str, owner_id: str, ttl_seconds: int, now: datetime) -> LegacyVerdict: ...

    def release(self, *, task_id: str, owner_id: str, now: datetime) -> LegacyVerdict: ...

    def complete(
        self,
        *,
        task_id: str,
        namespace: str,
        owner_id: str,
        result: Any,
        result_digest: str,
        now: datetime,
        via: str = "legacy",
    ) -> LegacyVerdict: ...

    def record_claim(
        self,
        *,
        task_id: str,
        namespace: str,
        owner_id: str,
        expires_at: datetime | None,
        now: datetime,
        pool: str = "",
    ) -> None:
        """Write claim.v1's decision (V1_WRITES), whatever the row says: the rollback target must match it."""
        ...

    def get(self, *, task_id: str) -> LegacyClaim | None: ...

    def live_claims(self, *, namespace: str, now: datetime, pool: str | None = None) -> list[LegacyClaim]: ...


class DjangoLegacyStore:
    """The naive table on ``LegacyClaim``. Every method runs inside the caller's transaction."""

    def _row(self, task_id: str) -> LegacyClaim | None:
        return LegacyClaim.objects.select_for_update().filter(pk=task_id).first()

    def claim(
        self, *, task_id, namespace, owner_id, ttl_seconds, now, pool="", via="legacy"
    ) -> LegacyVerdict:
        row = self._row(task_id)
        if (
            row is not None
            and row.owner_id
            and row.owner_id != owner_id
            and row.expires_at
            and row.expires_at > now
        ):
            return LegacyVerdict(False, "HELD", row.owner_id, row.expires_at)
        expires = now + timedelta(seconds=ttl_seconds)
        LegacyClaim.objects.update_or_create(
            task_id=task_id,
            defaults={
                "namespace": namespace,
                "owner_id": owner_id,
                "expires_at": expires,
                "pool": pool,
                "via": via,
                "updated_at": now,
            },
        )
        return LegacyVerdict(True, "GRANTED", owner_id, expires)

    def heartbeat(self, *, task_id, owner_id, ttl_seconds, now) -> LegacyVerdict:
        row = self._row(task_id)
        if row is None or row.owner_id != owner_id:
            return LegacyVerdict(
                False, "NOT_OWNER", row.owner_id if row else "", row.expires_at if row else None
            )
        row.expires_at, row.updated_at = now + timedelta(seconds=ttl_seconds), now
        row.save(update_fields=["expires_at", "updated_at"])
        return LegacyVerdict(True, "RENEWED", owner_id, row.expires_at)

    def release(self, *, task_id, owner_id, now) -> LegacyVerdict:
        row = self._row(task_id)
        if row is None or row.owner_id != owner_id:
            return LegacyVerdict(
                False, "NOT_OWNER", row.owner_id if row else "", row.expires_at if row else None
            )
        row.owner_id, row.expires_at, row.updated_at = "", None, now
        row.save(update_fields=["owner_id", "expires_at", "updated_at"])
        return LegacyVerdict(True, "RELEASED", "", None)

    def complete(
        self, *, task_id, namespace, owner_id, result, result_digest, now, via="legacy"
    ) -> LegacyVerdict:
        # Unconditional: whoever completes last wins. This is the bug the migration exists to remove.
        LegacyClaim.objects.update_or_create(
            task_id=task_id,
            defaults={
                "namespace": namespace,
                "result": result,
                "result_digest": result_digest,
                "completed_by": owner_id,
                "via": via,
                "updated_at": now,
            },
        )
        return LegacyVerdict(True, "COMPLETED", owner_id, None)

    def record_claim(self, *, task_id, namespace, owner_id, expires_at, now, pool="") -> None:
        LegacyClaim.objects.update_or_create(
            task_id=task_id,
            defaults={
                "namespace": namespace,
                "owner_id": owner_id,
                "expires_at": expires_at,
                "pool": pool,
                "via": "claim.v1",
                "updated_at": now,
            },
        )

    def get(self, *, task_id) -> LegacyClaim | None:
        return LegacyClaim.objects.filter(pk=task_id).first()

    def live_claims(self, *, namespace, now, pool=None) -> list[LegacyClaim]:
        rows = LegacyClaim.objects.filter(namespace=namespace, expires_at__gt=now, completed_by="").exclude(
            owner_id=""
        )
        if pool is not None:
            rows = rows.filter(pool=pool)
        return list(rows)


@cache
def legacy_store() -> LegacyStore:
    path = getattr(settings, "ROLLOUT_LEGACY_STORE", "rollout.legacy.DjangoLegacyStore")
    return import_string(path)()
