"""Observe mode on PostgreSQL: the team's binaries keep writing their table; the control plane follows its changes
through logical decoding (the built-in ``pgoutput``, read with the SQL functions over psycopg 3) and judges each
legacy decision it sees with claim.v1 in shadow — a claim (a takeover when the row's owner had expired), a heartbeat,
a release, a complete — recorded and compared as the proxy mode records and compares them (docs/adopting.md).

Exactly once: each judgement is one transaction of ours holding the claim.v1 decision (made under the stage hook's
kind of guard: ``_Observed.settle`` runs inside the core's transaction), legacy's history, the comparison and the
stream position (``ObserverPosition``); a decision claim.v1 refuses commits nothing of its own, and its comparison
and position are one transaction. A killed observer re-reads from the slot's confirmed position (advanced only past
transactions wholly judged) and skips what its position says is judged.

Time: legacy decided on its own clock, at its commit; claim.v1 judges when the observer reads it. A takeover legacy
allowed because the owner's expiry had passed (at the commit) ends that owner's claim.v1 attempt first — the expiry
legacy's own rule applied — so claim.v1 judges the new claim, not a lease the observer's delay kept alive.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, connections, transaction
from django.db.models import F
from django.db.models.functions import Now

from claims import clock, interleave
from claims import services as core
from claims.digest import digest
from claims.errors import ClaimError
from claims.models import Namespace, Role, Task
from claims.validation import real_text

from .. import pgoutput
from ..legacy import LegacyVerdict, legacy_store
from ..legacy_check import check as preflight
from ..models import LegacyClaim, LegacyEvent, LegacyWrite, ObserverPosition, Stage
from ..selectors import shadow_began, stage_at
from .legacy_api import last_attempt
from .legacy_decisions import release_held
from .operations import (
    CLAIM,
    COMPLETE,
    HEARTBEAT,
    LEGACY,
    RELEASE,
    Mirrored,
    TaskOperation,
    V1Verdict,
    refused,
)
from .shadow import compare, record_direct_write


class ObserveRefused(Exception):
    """The pre-flight found what to change before observing (the message lists it)."""


@dataclass(frozen=True)
class Observed:
    """One legacy decision read from the stream."""

    operation: TaskOperation  # operations.CLAIM, HEARTBEAT, RELEASE or COMPLETE
    task_id: str
    namespace: str
    owner_id: str
    row: LegacyClaim  # the row after it
    before: LegacyClaim | None
    committed_at: datetime  # when legacy decided: its commit (a polled row: when the observer saw it)
    position: dict[str, Any]  # the ObserverPosition fields its judgement moves the position to
    api: str = LEGACY  # an old binary's write, seen in the table


def setup() -> ObserverPosition:
    """After the pre-flight passes (else ObserveRefused with what to change): the publication and the slot, each
    created only if missing, and the position. Returns the position."""
    report = preflight(observe=True)
    if report.problems:
        raise ObserveRefused("; ".join(report.problems))
    store = legacy_store()
    mapping = store.mapping  # type: ignore[attr-defined]
    publication, slot = settings.LEGACY_OBSERVE_PUBLICATION, settings.LEGACY_OBSERVE_SLOT
    with connections[mapping.database].cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_publication WHERE pubname = %s", [publication])
        if cursor.fetchone() is None:
            cursor.execute(f"CREATE PUBLICATION {publication} FOR TABLE {store.quote(mapping.table)}")  # type: ignore[attr-defined]
        cursor.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [slot])
        if cursor.fetchone() is None:
            cursor.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", [slot])
    position, _ = ObserverPosition.objects.get_or_create(name=slot, defaults={"updated_at": clock.now()})
    return position


def resnapshot_allowed(*, principal: Any, reason: str) -> str:
    """A resnapshot's rules (its role, a real reason), checked before anything is done: the reason, trimmed."""
    if principal.role != Role.ONCALL:
        raise ObserveRefused(f"{principal.name} is {principal.role}: a resnapshot is oncall's")
    return real_text(
        reason, why="A resnapshot needs a reason: the legacy decisions in the gap are never judged."
    )


def resnapshot(*, principal: Any, reason: str) -> ObserverPosition:
    """After the slot was invalidated (``wal_status = lost``: the WAL it needed is gone) or dropped — oncall's: a new
    slot, the position reset to it, and the gap audited. The legacy decisions between the last judged commit and the
    new slot's start are never judged (the runbook says so). The pre-flight runs again first."""
    reason = resnapshot_allowed(principal=principal, reason=reason)
    store = legacy_store()
    slot = settings.LEGACY_OBSERVE_SLOT
    with connections[store.mapping.database].cursor() as cursor:  # type: ignore[attr-defined]
        cursor.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [slot])
        if cursor.fetchone() is not None:
            cursor.execute("SELECT pg_drop_replication_slot(%s)", [slot])
    before = ObserverPosition.objects.filter(name=slot).first()
    gap_from = before.last_commit_at.isoformat() if before and before.last_commit_at else None
    position = setup()
    with transaction.atomic(durable=True):
        now = clock.now()
        ObserverPosition.objects.filter(pk=position.pk).update(lsn="0/0", index=0, updated_at=now)
        core.audit(
            principal=principal,
            action="observer_resnapshot",
            at=now,
            target=f"slot:{slot}",
            reason=reason,
            detail={"unjudged_after": gap_from},
        )
    position.refresh_from_db()
    return position


def observe_once(*, limit: int = 1000) -> dict[str, Any]:
    """Read up to ``limit`` changes (whole transactions) from the slot, judge the legacy decisions among them, then
    let the slot forget what was judged. Returns counts."""
    store = legacy_store()
    mapping = store.mapping  # type: ignore[attr-defined]
    slot = settings.LEGACY_OBSERVE_SLOT
    legacy = connections[mapping.database]
    with legacy.cursor() as cursor:
        cursor.execute(
            "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes(%s, NULL, %s, 'proto_version', '1', "
            "'publication_names', %s)",
            [slot, limit, settings.LEGACY_OBSERVE_PUBLICATION],
        )
        rows = cursor.fetchall()
    position = ObserverPosition.objects.get(name=slot)
    counts = {"transactions": 0, "judged": 0, "unknown": 0, "direct": 0, "more": int(len(rows) >= limit)}
    table = mapping.table if "." in mapping.table else f"public.{mapping.table}"
    done = None
    oldest: datetime | None = None  # the commit of the oldest transaction this pass read: how long it waited
    for txn in pgoutput.transactions(rows):
        done = txn
        if _lsn(txn.lsn) < _lsn(position.lsn):
            continue
        skip = position.index if txn.lsn == position.lsn else 0
        counts["transactions"] += 1
        if oldest is None or txn.committed_at < oldest:
            oldest = txn.committed_at
        for index, change in enumerate(txn.changes, start=1):
            if index <= skip or change.table != table:
                continue
            known = change.new is None or _adopted(store, change.new)
            seen = _decision(store, change, txn, index)
            if seen is None:
                continue
            if not known:
                ObserverPosition.objects.filter(pk=position.pk).update(unknown=F("unknown") + 1)
                counts["unknown"] += 1
                continue
            outcome = judge(seen, position.pk)
            if outcome in counts:
                counts[outcome] += 1
    if done is not None:
        _advance(legacy, slot, position.pk, done)
    return {**counts, "oldest": oldest}


def _adopted(store: Any, values: dict[str, Any]) -> bool:
    """A row claim.v1 has no task for becomes one (an INSERT of theirs, or a row from before): docs/adopting.md."""
    from .adoption import adopt_seen

    row = store.from_text(values)
    return adopt_seen(task_id=row.task_id, namespace=row.namespace, values=values)


def _decision(store: Any, change: pgoutput.Change, txn: pgoutput.Transaction, index: int) -> Observed | None:
    """What a row change decided, in legacy's terms, or None (an insert of a free row, a payload edit, a delete)."""
    if change.new is None:
        return None
    after = store.from_text(change.new)
    before = store.from_text(change.old) if change.old is not None else None
    return decided(before, after, txn.committed_at, {"lsn": txn.lsn, "index": index})


def decided(
    before: LegacyClaim | None, after: LegacyClaim, at: datetime, position: dict[str, Any]
) -> Observed | None:
    """The legacy decision a row's change from ``before`` to ``after`` was, or None."""
    was_owner = before.owner_id if before else ""
    seen: tuple[TaskOperation, str] | None = None
    completed_before = (before.completed_by, before.result) if before else ("", None)
    if after.completed_by and (after.completed_by, after.result) != completed_before:  # last write wins there
        seen = (COMPLETE, after.completed_by if after.completed_by != "?" else after.owner_id)
    elif after.owner_id and after.owner_id != was_owner:
        seen = (CLAIM, after.owner_id)
    elif after.owner_id and before is not None and after.expires_at != before.expires_at:
        seen = (HEARTBEAT, after.owner_id)
    elif not after.owner_id and was_owner:
        seen = (RELEASE, was_owner)
    if seen is None:
        return None
    operation, owner = seen
    return Observed(operation, after.task_id, after.namespace, owner, after, before, at, position)


class _Observed(core.Guard):
    """Records one judgement inside the claim.v1 decision's own transaction (or, refused, in one of its own)."""

    def __init__(self, seen: Observed, position_id: int, also: Callable[[], None] | None = None):
        self.seen, self.position_id, self.also = seen, position_id, also

    def settle(self, point: str, ns: core.NamespaceHold, value: Any) -> None:
        self.record(self.seen.operation.verdict(value))

    def record(self, v1: V1Verdict) -> None:
        seen = self.seen
        verdict = _in_history(seen)
        # the winner as this change left it (legacy_row), not as the table is by the time it is read
        compare(seen, seen.operation, verdict, v1, legacy_row=seen.row)
        interleave.reach("observe.recorded")
        _moved(seen, self.position_id, self.also, judged=True)


def judge(seen: Observed, position_id: int, also: Callable[[], None] | None = None) -> str:
    """One legacy decision judged by claim.v1 and recorded with the position (and ``also``, in the same
    transaction) — exactly once. Where legacy no longer decides (V1_WRITES, V1_ONLY) nothing is judged: a change
    that is not claim.v1's own write-through is an old binary writing the table directly — a DIRECT_WRITE mismatch of
    its own (``police``). Passed over, whatever the stage: a change of claim.v1's own (a rollback's write-back lands
    in SHADOW). A claim claim.v1 already holds for that owner — entering SHADOW imported it while the observer had
    not read it yet — agrees without asking claim.v1 again. Returns which: judged, ours, direct, or passed.

    Judged on legacy's clock: every reading of the clock inside is the instant legacy committed the change
    (``clock.as_of``), so the verdict does not depend on when the observer read it — a lagging, paused or restarted
    observer judges as one that kept up. Changes are judged in legacy's commit order (the stream's), each by the
    stage the namespace had when legacy committed it."""
    with clock.as_of(seen.committed_at):
        return _judge(seen, position_id, also)


def _judge(seen: Observed, position_id: int, also: Callable[[], None] | None) -> str:
    stage = stage_at(
        seen.namespace, seen.committed_at
    )  # the stage legacy decided in, however late it is read
    if stage in (Stage.V1_WRITES, Stage.V1_ONLY):
        return police(seen, position_id, also)
    ours = _written_through(seen)
    if stage == Stage.LEGACY or ours:
        with transaction.atomic(durable=True):
            _moved(seen, position_id, also, judged=False)
        return "ours" if ours else "passed"
    if _from_before_shadow(seen):
        with transaction.atomic(durable=True):
            _moved(seen, position_id, also, judged=False)
        return "passed"
    held = _held_already(seen)
    if held is not None:
        with transaction.atomic(durable=True):
            _Observed(seen, position_id, also).record(CLAIM.verdict(held))
        return "judged"
    hook = _Observed(seen, position_id, also)
    principal = core.principal_ensure(name=seen.owner_id, role=Role.WORKER)
    if seen.operation.claims and seen.before is not None and seen.before.owner_id:
        _expired_in_legacy(seen.before.owner_id, seen.task_id)
    try:
        with core.guarded(hook), core.acting_via(LEGACY):
            _mirror(seen, principal)
    except ClaimError as exc:
        with transaction.atomic(durable=True):
            hook.record(refused(exc))
    return "judged"


def _in_history(seen: Observed) -> LegacyVerdict:
    """Legacy's decision as observed, appended to its history; its verdict."""
    verdict = LegacyVerdict(
        True, seen.operation.legacy_word, seen.owner_id, seen.row.expires_at, seen.committed_at
    )
    LegacyEvent.objects.create(
        namespace=seen.namespace,
        task_id=seen.task_id,
        operation=seen.operation.name,
        api=LEGACY,
        owner_id=seen.owner_id,
        verdict=verdict.word,
        accepted=True,
        at=seen.committed_at,
    )
    return verdict


def police(seen: Observed, position_id: int, also: Callable[[], None] | None = None) -> str:
    """From V1_WRITES on: the change is claim.v1's own write-through (an applied ``LegacyWrite`` of the task that
    wrote these values), or a direct write by an old binary — recorded with legacy's history as a DIRECT_WRITE
    mismatch, in one transaction with the position."""
    with transaction.atomic(durable=True):
        ours = _written_through(seen)
        if not ours:
            verdict = _in_history(seen)
            record_direct_write(
                namespace=seen.namespace,
                task_id=seen.task_id,
                operation=seen.operation.name,
                owner_id=seen.owner_id,
                legacy=verdict,
                at=seen.committed_at,
            )
        _moved(seen, position_id, also, judged=False)
    return "ours" if ours else "direct"


def _written_through(seen: Observed) -> bool:
    """Did claim.v1's write-through (or a rollback's write-back) leave the row so?"""
    for write in LegacyWrite.objects.filter(task_id=seen.task_id, applied_at__isnull=False).order_by("-id")[
        :20
    ]:
        fields = write.fields
        if write.kind == "complete":
            if seen.operation.commits and fields.get("owner_id") == seen.owner_id:
                return True
            continue
        expires = fields.get("expires_at")
        same_expiry = (expires is None and seen.row.expires_at is None) or (
            expires is not None
            and seen.row.expires_at is not None
            and abs((datetime.fromisoformat(expires) - seen.row.expires_at).total_seconds()) < 1
        )
        if (fields.get("owner_id") or "") == seen.row.owner_id and same_expiry:
            return True
    return False


def _moved(seen: Observed, position_id: int, also: Callable[[], None] | None, *, judged: bool) -> None:
    if also is not None:
        also()
    lease: dict[str, Any] = {}
    if seen.operation.sets_expiry and seen.row.expires_at is not None:
        lease["lease_seconds"] = (seen.row.expires_at - seen.committed_at).total_seconds()
    ObserverPosition.objects.filter(pk=position_id).update(
        **seen.position,
        **lease,
        judged=F("judged") + (1 if judged else 0),
        last_commit_at=seen.committed_at,
        updated_at=Now(),  # the wall clock: inside a judgement clock.now() is legacy's commit
    )


def _mirror(seen: Observed, principal: Any) -> Any:
    """claim.v1's decision on what legacy decided (the operation's own mirror), as that owner — the attempt claim.v1
    last granted it — a complete committed inline with the row's result."""
    each, epoch, attempt = seen.operation, 0, None
    if each.claims:
        epoch = Namespace.objects.get(name=seen.namespace).scheduler_epoch
    else:
        attempt = last_attempt(seen.task_id, seen.owner_id)
    result = seen.row.result if each.commits else None
    return each.mirror(
        Mirrored(
            principal, seen.task_id, seen.owner_id, epoch, _ttl(seen), attempt, result,
            digest(result) if each.commits else "", staged=False,
        )
    )  # fmt: skip


def _from_before_shadow(seen: Observed) -> bool:
    """A heartbeat, release or complete under a lease legacy granted before the namespace entered SHADOW that
    claim.v1 never saw: the row before it shows this owner holding an unexpired lease, claim.v1 granted this owner no
    attempt on the task, and no claim of this owner on it was judged since SHADOW began — it was granted in LEGACY and
    ended before the import read the table. claim.v1 cannot judge it: passed, as a LEGACY-stage change is. (A stale
    write under an expired or taken-over lease is still judged: the row before names another owner or a past
    expiry.)"""
    before = seen.before
    if seen.operation.claims or before is None or before.owner_id != seen.owner_id:
        return False
    if before.expires_at is None or before.expires_at <= seen.committed_at:
        return False
    if last_attempt(seen.task_id, seen.owner_id) is not None:
        return False
    since = shadow_began(seen.namespace, seen.committed_at)
    return (
        since is not None
        and not LegacyEvent.objects.filter(
            task_id=seen.task_id, owner_id=seen.owner_id, operation=CLAIM.name, at__gte=since
        ).exists()
    )


def _held_already(seen: Observed) -> Task | None:
    if not seen.operation.claims:
        return None
    return Task.objects.filter(
        pk=seen.task_id, state="CLAIMED", owner_id=seen.owner_id, lease_expires_at__gt=clock.now()
    ).first()


def _expired_in_legacy(previous: str, task_id: str) -> None:
    """Legacy let the task go to another owner because ``previous``'s expiry had passed: that owner's claim.v1
    attempt, if the observer's delay keeps it live, ends as legacy's rule ended it."""
    release_held(task_id, previous)


def _ttl(seen: Observed) -> int:
    if seen.row.expires_at is None:
        return settings.LEASE_MIN_SECONDS
    # Rounded up: claim.v1's lease never ends before legacy's (a takeover after legacy's expiry ends it first).
    seconds = math.ceil((seen.row.expires_at - seen.committed_at).total_seconds())
    return max(settings.LEASE_MIN_SECONDS, min(settings.LEASE_MAX_SECONDS, seconds))


def _advance(legacy: Any, slot: str, position_id: int, last: pgoutput.Transaction) -> None:
    """Every transaction read is judged: the position says so, and the slot lets their WAL go — once our record of
    the judgement would survive a failover of our own database (``_releasable``)."""
    ObserverPosition.objects.filter(pk=position_id).update(
        lsn=last.lsn, index=len(last.changes), updated_at=clock.now()
    )
    release = _releasable(position_id, last.lsn)
    with legacy.cursor() as cursor:
        if release is not None:
            cursor.execute("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", [slot, release])
        cursor.execute(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint FROM pg_replication_slots "
            "WHERE slot_name = %s",
            [slot],
        )
        (lag,) = cursor.fetchone()
    ObserverPosition.objects.filter(pk=position_id).update(lag_bytes=lag)


_OURS = """
SELECT pg_current_wal_lsn()::text,
       current_setting('synchronous_standby_names') <> ''
         AND current_setting('synchronous_commit') IN ('on', 'remote_apply', 'remote_write'),
       (SELECT count(*) FROM pg_stat_replication),
       (SELECT min(flush_lsn)::text FROM pg_stat_replication)
"""


def _releasable(position_id: int, judged: str) -> str | None:
    """How far the slot may forget now, or None. Where our database fails over asynchronously its last commits can
    be lost — judgements and position with them — while the slot, in the team's database, would already have let
    those changes go: never judged. So the slot is advanced only to a position whose record in our WAL is flushed on
    every standby (``pg_stat_replication``): the position judged is kept pending with our WAL position after it, and
    released by a later pass once the standbys have it — the slot lags a pass behind. At once where our database is
    synchronous, has no standby (``auto``), or where LEGACY_OBSERVE_SLOT_RELEASE is ``commit``."""
    # ``ours`` below must come after the position's commit record: the update above committed on its own.
    assert not connection.in_atomic_block, "the position's update must be committed before our WAL is read"
    mode = settings.LEGACY_OBSERVE_SLOT_RELEASE
    at_once = connection.vendor != "postgresql" or mode == "commit"
    if not at_once:
        with connection.cursor() as cursor:
            cursor.execute(_OURS)
            ours, synchronous, standbys, flushed = cursor.fetchone()
        at_once = synchronous or (standbys == 0 and mode == "auto")
    if at_once:
        ObserverPosition.objects.filter(pk=position_id).update(
            pending_lsn="", pending_ours="", released_lsn=judged
        )
        return judged
    position = ObserverPosition.objects.get(pk=position_id)
    release = None
    if position.pending_lsn and flushed is not None and _lsn(flushed) >= _lsn(position.pending_ours):
        release = position.pending_lsn
    if release is not None or not position.pending_lsn:  # a pending position waits until the standbys have it
        left = "" if release == judged else judged
        ObserverPosition.objects.filter(pk=position_id).update(
            pending_lsn=left, pending_ours=ours if left else "", released_lsn=release or position.released_lsn
        )
    return release


def _lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)
