"""The legacy claim store behind a small adapter interface.

``LegacyStore`` is what the rollout needs from today's claim table; ``DjangoLegacyStore`` reproduces its naive
semantics faithfully on ``rollout.LegacyClaim``: a claim is owner + expires_at, after expiry anyone takes over,
a heartbeat or release by the named owner succeeds, and ``complete`` writes the result without checking who
holds the claim now — last write wins. (Each operation is atomic — we reproduce the protocol's semantics, not
its implementation's races.)

Every decision runs inside the caller's transaction and follows the house rule: the store locks the row it decides
on, then reads the clock, then decides and writes — and reports the instant it decided on (``LegacyVerdict.at``).

To run the migration against an existing table, implement ``LegacyStore`` over it and set
``ROLLOUT_LEGACY_STORE`` to its dotted path; see docs/rollout.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any, Protocol

from django.conf import settings
from django.db import connection
from django.utils.module_loading import import_string

from claims import clock

from .models import LegacyClaim


@dataclass(frozen=True)
class LegacyVerdict:
    accepted: bool
    word: str  # GRANTED | HELD | RENEWED | RELEASED | NOT_OWNER | COMPLETED
    owner_id: str
    expires_at: datetime | None
    at: datetime | None = None  # the clock the store decided on, read after its row lock


class LegacyStore(Protocol):
    def claim(
        self,
        *,
        task_id: str,
        namespace: str,
        owner_id: str,
        ttl_seconds: int,
        pool: str = "",
        via: str = "legacy",
    ) -> LegacyVerdict: ...

    def heartbeat(self, *, task_id: str, owner_id: str, ttl_seconds: int) -> LegacyVerdict: ...

    def release(self, *, task_id: str, owner_id: str) -> LegacyVerdict: ...

    def complete(
        self,
        *,
        task_id: str,
        namespace: str,
        owner_id: str,
        result: Any,
        result_digest: str,
        via: str = "legacy",
    ) -> LegacyVerdict: ...

    def record_claim(
        self, *, task_id: str, namespace: str, owner_id: str, expires_at: datetime | None, pool: str = ""
    ) -> None:
        """Write claim.v1's decision (V1_WRITES), whatever the row says: the rollback target must match it."""
        ...

    def get(self, *, task_id: str) -> LegacyClaim | None: ...

    def live_claims(self, *, namespace: str, now: datetime, pool: str | None = None) -> list[LegacyClaim]: ...


_COLUMNS = ("namespace", "owner_id", "expires_at", "result", "result_digest", "completed_by", "via", "pool")


class DjangoLegacyStore:
    """The naive table on ``LegacyClaim``. Every method runs inside the caller's transaction: the row FOR UPDATE,
    then the clock, then one write — three statements."""

    def _held(self, task_id: str) -> tuple[LegacyClaim | None, datetime]:
        row = LegacyClaim.objects.select_for_update().filter(pk=task_id).first()
        return row, clock.now()  # read after the row's lock

    def _put(self, task_id: str, row: LegacyClaim | None, now: datetime, **values: Any) -> bool:
        """Write ``values`` to the row held (or a new row): False when a concurrent writer inserted the row first
        — the caller decides again on the row it can now lock."""
        if row is not None:
            LegacyClaim.objects.filter(pk=task_id).update(updated_at=now, **values)
            return True
        fresh = LegacyClaim(task_id=task_id, updated_at=now, **values)
        fields = _fields(("task_id", "updated_at", *_COLUMNS))
        prepared = [field.get_db_prep_save(getattr(fresh, field.attname), connection) for field in fields]
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {LegacyClaim._meta.db_table} ({', '.join(f.column for f in fields)}) "
                f"VALUES ({', '.join(['%s'] * len(fields))}) ON CONFLICT (task_id) DO NOTHING",
                prepared,
            )
            return cursor.rowcount == 1

    def claim(self, *, task_id, namespace, owner_id, ttl_seconds, pool="", via="legacy") -> LegacyVerdict:
        row, now = self._held(task_id)
        if (
            row is not None
            and row.owner_id
            and row.owner_id != owner_id
            and row.expires_at
            and row.expires_at > now
        ):
            return LegacyVerdict(False, "HELD", row.owner_id, row.expires_at, now)
        expires = now + timedelta(seconds=ttl_seconds)
        values = {
            "namespace": namespace,
            "owner_id": owner_id,
            "expires_at": expires,
            "pool": pool,
            "via": via,
        }
        if not self._put(task_id, row, now, **values):
            return self.claim(
                task_id=task_id,
                namespace=namespace,
                owner_id=owner_id,
                ttl_seconds=ttl_seconds,
                pool=pool,
                via=via,
            )
        return LegacyVerdict(True, "GRANTED", owner_id, expires, now)

    def heartbeat(self, *, task_id, owner_id, ttl_seconds) -> LegacyVerdict:
        row, now = self._held(task_id)
        if row is None or row.owner_id != owner_id:
            return _not_owner(row, now)
        expires = now + timedelta(seconds=ttl_seconds)
        self._put(task_id, row, now, expires_at=expires)
        return LegacyVerdict(True, "RENEWED", owner_id, expires, now)

    def release(self, *, task_id, owner_id) -> LegacyVerdict:
        row, now = self._held(task_id)
        if row is None or row.owner_id != owner_id:
            return _not_owner(row, now)
        self._put(task_id, row, now, owner_id="", expires_at=None)
        return LegacyVerdict(True, "RELEASED", "", None, now)

    def complete(self, *, task_id, namespace, owner_id, result, result_digest, via="legacy") -> LegacyVerdict:
        # Unconditional: whoever completes last wins. This is the bug the migration exists to remove.
        row, now = self._held(task_id)
        values = {
            "namespace": namespace,
            "result": result,
            "result_digest": result_digest,
            "completed_by": owner_id,
            "via": via,
        }
        if not self._put(task_id, row, now, **values):
            return self.complete(
                task_id=task_id,
                namespace=namespace,
                owner_id=owner_id,
                result=result,
                result_digest=result_digest,
                via=via,
            )
        return LegacyVerdict(True, "COMPLETED", owner_id, None, now)

    def record_claim(self, *, task_id, namespace, owner_id, expires_at, pool="") -> None:
        row, now = self._held(task_id)
        values = {"namespace": namespace, "owner_id": owner_id, "expires_at": expires_at, "pool": pool}
        if not self._put(task_id, row, now, via="claim.v1", **values):
            self.record_claim(
                task_id=task_id, namespace=namespace, owner_id=owner_id, expires_at=expires_at, pool=pool
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


def _not_owner(row: LegacyClaim | None, now: datetime) -> LegacyVerdict:
    return LegacyVerdict(
        False, "NOT_OWNER", row.owner_id if row else "", row.expires_at if row else None, now
    )


@cache
def _fields(names: tuple[str, ...]) -> list[Any]:
    return [LegacyClaim._meta.get_field(name) for name in names]


@cache
def legacy_store() -> LegacyStore:
    path = getattr(settings, "ROLLOUT_LEGACY_STORE", "rollout.legacy.DjangoLegacyStore")
    return import_string(path)()
