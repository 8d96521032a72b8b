"""Protected resources (claim-v1.md §7): fence tokens scoped to the resource, taken by every claim.

A resource's fence token is a counter on its key that never restarts, across incarnations too. Every claim of a
task that lists the resource takes the next token *in the claim's transaction*, so the takeover establishes the
new fence at the resource before the new holder — or anyone — acts on it: a delayed write carrying an older
token, from the task's previous owner or another task, is refused by the check (and by a receiver that enforces
tokens with ``claim_client.receiver`` (the SDK, clients/python)).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F, QuerySet

from .. import clock
from ..errors import Expired, NotClaimable, NotFound, ResourceExists, StaleFence, StaleInput
from ..models import Attempt, Principal, Resource, ResourceKey, Task, TaskState
from . import _sql
from ._base import NamespaceHold, audit, locked_rows


@dataclass(frozen=True)
class ResourceView:
    resource_key: str
    incarnation: Any
    revision: int
    fence_token: int
    holder: dict[str, Any] | None


def _live_holder(key: ResourceKey, now: datetime) -> Task | None:
    """The task whose live attempt holds ``key``: the newest token's taker, if that attempt is still the task's
    current claim, unexpired and granted under its namespace's current epoch."""
    if key.holder_attempt_id is None:
        return None
    return (
        _live_claims(now)
        .filter(pk=key.holder_task_id, attempt_id=key.holder_attempt_id)
        .only("task_id", "attempt_id", "owner_id", "lease_expires_at", "claim_generation")
        .first()
    )


def _live_claims(now: datetime) -> QuerySet[Task]:
    """Tasks whose current claim is live at ``now``: CLAIMED, unexpired, granted under the namespace's current
    epoch. A key's holder is live when its attempt is one of these tasks' current attempt."""
    return Task.objects.filter(
        state=TaskState.CLAIMED, lease_expires_at__gt=now, scheduler_epoch=F("namespace__scheduler_epoch")
    )


class KeysForClaims:
    """The resource keys a claim (or a batch of claims) may take, locked FOR UPDATE in key order after the task
    rows, with the clock read once they were held (``now``): every holder is judged on that clock, and a grant that
    takes a key records its attempt's start and lease from it — so no record shows a new holder starting inside
    the previous holder's lease. ``skip_locked``: keys another transaction is deciding on are left out (a batch's
    later rounds, which already hold keys and so must never wait for more: that could close a cycle); a task
    listing a key left out is not free."""

    def __init__(self, ns: NamespaceHold):
        self.ns = ns
        self.rows: dict[str, ResourceKey] = {}
        self.live_holders: set[tuple[str, Any]] = set()
        self.taken: set[str] = set()  # keys a grant of this transaction took

    def lock(self, tasks: list[Task], *, skip_locked: bool = False) -> KeysForClaims:
        """Lock the keys ``tasks`` list that this transaction has not locked yet, in key order, and read the clock
        after them (``ns``)."""
        keys = sorted({key for task in tasks for key in task.resources} - self.rows.keys())
        if not keys:
            return self
        lock = "FOR UPDATE SKIP LOCKED" if skip_locked else "FOR UPDATE"
        locked, db_now = lock_keys(keys, lock=lock)
        self.ns = self.ns.at(db_now)
        self.rows.update({row.resource_key: row for row in locked})
        holders = {row.holder_task_id for row in locked if row.holder_task_id is not None}
        if holders:
            self.live_holders |= set(
                _live_claims(self.ns.now).filter(pk__in=holders).values_list("task_id", "attempt_id")
            )
        return self

    def held_against(self, task: Task) -> str | None:
        """The first key of ``task`` it may not take now — a live attempt of another task holds it, a grant of this
        transaction took it, or it was left out locked — or None when the task is free to take them all."""
        for key in sorted(task.resources):
            row = self.rows.get(key)
            if row is None or key in self.taken:
                return key
            holder = (row.holder_task_id, row.holder_attempt_id)
            if row.holder_task_id not in (None, task.task_id) and holder in self.live_holders:
                return key
        return None

    def require_free(self, task: Task) -> None:
        key = self.held_against(task)
        if key is not None:
            row = self.rows.get(key)
            by = row.holder_task_id if row is not None else None
            raise NotClaimable(
                f"resource {key} is held by a live attempt of task {by}",
                reason="RESOURCE_HELD",
                current={"resource": {"resource_key": key, "held_by_task": by}},
            )

    def take(self, task: Task) -> tuple[dict[str, int], dict[str, dict[str, Any]], list[_sql.Statement]]:
        """Once ``task`` carries its new attempt: the next token at each of its keys. Returns the API's ``fences``,
        what the attempt keeps ({key: {"incarnation", "token"}}) and the key writes, not yet sent."""
        if not task.resources:
            return {}, {}, []
        keys = sorted(task.resources)
        live = dict(
            Resource.objects.filter(key_id__in=keys, deleted_at__isnull=True).values_list(
                "key_id", "incarnation"
            )
        )
        fences, kept, writes = {}, {}, []
        for key in keys:
            row = self.rows[key]
            token = row.fence_token + 1
            writes.append(
                _sql.update_statement(
                    ResourceKey,
                    {"resource_key": key},
                    fence_token=token,
                    holder_task_id=task.task_id,
                    holder_attempt_id=task.attempt_id,
                )
            )
            row.fence_token, row.holder_task_id, row.holder_attempt_id = token, task.task_id, task.attempt_id
            self.taken.add(key)
            fences[key] = token
            incarnation = live.get(key)
            kept[key] = {"incarnation": str(incarnation) if incarnation else None, "token": token}
        return fences, kept, writes


def lock_keys(keys: list[str], *, lock: str) -> tuple[list[ResourceKey], Any]:
    """The resource keys locked in key order — every service that locks keys takes them after its task row and
    in this order, so two of them never wait on each other in a cycle — and the clock read after the locks."""
    return locked_rows(
        ResourceKey,
        f"resource_key IN ({_sql.placeholders(keys)})",
        list(keys),
        order="resource_key",
        lock=lock,
    )


def check_renew_resources(task: Task, keys: list[ResourceKey]) -> None:
    """A renew of a task that lists resources, on its keys held FOR SHARE (``lock_keys``, after the task row): a
    claim of another task that takes one of them (FOR UPDATE) is ordered against this renew. If such a claim came
    first — possible only once this lease had run out — the attempt no longer holds the resource: EXPIRED."""
    for row in keys:
        if row.holder_attempt_id != task.attempt_id:
            raise Expired(
                f"the lease ran out and task {row.holder_task_id} took resource {row.resource_key}: claim again",
                current={"resource": {"resource_key": row.resource_key, "fence_token": row.fence_token}},
            )


def resource_current(key: ResourceKey, live: Resource | None) -> dict[str, Any]:
    return {
        "resource_key": key.resource_key,
        "incarnation": str(live.incarnation) if live else None,
        "revision": live.revision if live else None,
        "fence_token": key.fence_token,
    }


def lock_commit_resources(keys: list[str]) -> tuple[dict[str, ResourceKey], dict[str, Resource], Any]:
    """A commit's resources, locked before anything is decided (after the task row): the keys FOR UPDATE in key
    order — so a claim of another task cannot take a new token between our read of it and our write — then their
    live incarnations FOR UPDATE, in key order; and the clock read after both."""
    rows, _ = lock_keys(sorted(keys), lock="FOR UPDATE")
    live, db_now = locked_rows(
        Resource,
        f"key_id IN ({_sql.placeholders(keys)}) AND deleted_at IS NULL",
        sorted(keys),
        order="key_id",
        lock="FOR UPDATE",
    )
    return {row.resource_key: row for row in rows}, {row.key_id: row for row in live}, db_now


def check_commit_resources(
    *,
    attempt_id: Any,
    named: list[dict[str, Any]],
    locked: tuple[dict[str, ResourceKey], dict[str, Resource]],
    current: dict[str, Any],
) -> list[Any]:
    """Commit step 4, on the rows ``lock_commit_resources`` holds. Every named resource must still be the
    incarnation and revision the worker read, and the incarnation and fence token this attempt took at claim —
    else STALE_INPUT (RESOURCE) with the resource's values. Returns the incarnations for the revision bump."""
    if not named:
        return []
    rows, live = locked
    kept = Attempt.objects.filter(pk=attempt_id).values_list("fences", flat=True).first() or {}
    keys = sorted(item["resource_key"] for item in named)
    for item in sorted(named, key=lambda entry: entry["resource_key"]):
        key = item["resource_key"]
        incarnation = live.get(key)
        fence = kept.get(key, {})
        stale = (
            incarnation is None
            or str(incarnation.incarnation) != str(item["incarnation"])
            or incarnation.revision != item["expected_revision"]
            or fence.get("incarnation") != str(incarnation.incarnation)
            or fence.get("token") != rows[key].fence_token
        )
        if stale:
            raise StaleInput(
                f"resource {key} changed since this attempt read it or took its fence",
                reason="RESOURCE",
                current={**current, "resource": resource_current(rows[key], incarnation)},
            )
    return [live[key].incarnation for key in keys]


def bump_revisions(incarnations: list[Any]) -> None:
    if incarnations:
        Resource.objects.filter(pk__in=incarnations).update(revision=F("revision") + 1)


def check_dispatch_resources(keys: list[ResourceKey], *, attempt_fences: dict[str, Any]) -> None:
    """A dispatch is refused when a newer claim has taken one of the task's resources since this attempt's. On the
    keys held FOR SHARE (``lock_keys``, after the task and effect rows): a claim that would take a new token waits
    until the intent is recorded, so the recorded order decides."""
    for row in keys:
        if attempt_fences.get(row.resource_key, {}).get("token") != row.fence_token:
            raise StaleInput(
                f"a newer claim has taken resource {row.resource_key}",
                reason="RESOURCE",
                current={"resource": {"resource_key": row.resource_key, "fence_token": row.fence_token}},
            )


# --- the registry --------------------------------------------------------------------------------------


def resource_create(*, principal: Principal, resource_key: str) -> ResourceView:
    """A new incarnation at revision 0. The key's fence counter carries on from earlier incarnations."""
    with transaction.atomic(durable=True):
        now = clock.now()
        key, _ = ResourceKey.objects.get_or_create(resource_key=resource_key)
        key = ResourceKey.objects.select_for_update().get(pk=resource_key)
        if Resource.objects.filter(key=key, deleted_at__isnull=True).exists():
            raise ResourceExists(f"resource {resource_key} exists", current=resource_current(key, None))
        try:
            with transaction.atomic():
                live = Resource.objects.create(key=key, created_at=now)
        except IntegrityError:
            raise ResourceExists(f"resource {resource_key} exists") from None
        audit(
            principal=principal,
            action="resource_create",
            at=now,
            target=resource_key,
            detail={"incarnation": str(live.incarnation)},
        )
    return ResourceView(resource_key, live.incarnation, 0, key.fence_token, None)


def resource_delete(*, principal: Principal, resource_key: str) -> None:
    """End the live incarnation. Evidence from it can no longer authorise a write."""
    with transaction.atomic(durable=True):
        # The lock order every resource writer keeps: the key, then its incarnation.
        lock_keys([resource_key], lock="FOR UPDATE")
        now = clock.now()
        live = (
            Resource.objects.select_for_update().filter(key_id=resource_key, deleted_at__isnull=True).first()
        )
        if live is None:
            raise NotFound(f"no live resource {resource_key}")
        live.deleted_at = now
        live.save(update_fields=["deleted_at"])
        audit(
            principal=principal,
            action="resource_delete",
            at=now,
            target=resource_key,
            detail={"incarnation": str(live.incarnation), "revision": live.revision},
        )


def resource_get(*, resource_key: str) -> ResourceView:
    key = ResourceKey.objects.filter(pk=resource_key).first()
    live = Resource.objects.filter(key_id=resource_key, deleted_at__isnull=True).first() if key else None
    if key is None or live is None:
        raise NotFound(f"no live resource {resource_key}")
    holder = _live_holder(key, clock.now())
    return ResourceView(
        resource_key,
        live.incarnation,
        live.revision,
        key.fence_token,
        {"task_id": holder.task_id, "attempt_id": str(holder.attempt_id), "owner_id": holder.owner_id}
        if holder
        else None,
    )


def resource_check(
    *, resource_key: str, fence_token: int, incarnation: Any, expected_revision: int | None
) -> None:
    """The advisory check (§7), in order: STALE_INPUT (INCARNATION); STALE_FENCE unless the token is the newest
    and the attempt that took it is still live; STALE_INPUT (REVISION); else the caller answers CURRENT.
    Between this answer and the receiver's write a takeover can happen: receivers that can should enforce the
    token atomically in their own database (``claim_client.receiver`` (the SDK, clients/python))."""
    key = ResourceKey.objects.filter(pk=resource_key).first()
    live = Resource.objects.filter(key_id=resource_key, deleted_at__isnull=True).first() if key else None
    if key is None:
        raise NotFound(f"no resource {resource_key}")
    current = {"resource": resource_current(key, live)}
    if live is None or live.incarnation != incarnation:
        raise StaleInput("another incarnation of the resource", reason="INCARNATION", current=current)
    if fence_token != key.fence_token or _live_holder(key, clock.now()) is None:
        raise StaleFence("a newer claim has taken the resource, or the holder's claim ended", current=current)
    if expected_revision is not None and expected_revision != live.revision:
        raise StaleInput("the resource has another revision", reason="REVISION", current=current)


def resources_exist(keys: list[str]) -> list[str]:
    """The keys among ``keys`` with no live incarnation (for task create's 400)."""
    live = set(
        Resource.objects.filter(key_id__in=keys, deleted_at__isnull=True).values_list("key_id", flat=True)
    )
    return [key for key in keys if key not in live]
