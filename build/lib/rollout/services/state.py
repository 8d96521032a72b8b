"""The rollout's own record of each namespace: its stage and protocol minimum (``RolloutState``).

The core knows nothing of stages. A namespace the core created alone (``default``, or one created while the
rollout app was not installed) has no record and is read as V1_ONLY / legacy: claim.v1 decides, nothing is
mirrored. Every write here happens under the namespace's row lock (``claims.services.namespace_lock``, FOR NO
KEY UPDATE, taken first), the lock the core's fence and resume take too, so a stage change, a fence and a
rollback are ordered by it.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection, transaction

from claims import services as core
from claims.errors import InvalidTransition
from claims.models import Namespace, Principal

from ..models import DEFAULT_PROTOCOL, DEFAULT_STAGE, RolloutState, WorkerRegistration


@dataclass(frozen=True)
class Locked:
    """The namespace as held under its row lock, with its stage and protocol minimum read under the same lock."""

    hold: core.NamespaceHold
    stage: str
    min_protocol: str

    @property
    def name(self) -> str:
        return self.hold.name


def lock(*, name: str) -> Locked:
    """The namespace row FOR NO KEY UPDATE (first), then its rollout record FOR UPDATE; clock after both."""
    hold = core.namespace_lock(name=name)
    state = RolloutState.objects.select_for_update().filter(pk=hold.id).first()
    if state is None:
        return Locked(hold, DEFAULT_STAGE, DEFAULT_PROTOCOL)
    return Locked(hold, state.stage, state.min_protocol)


@dataclass(frozen=True)
class Held:
    """What a routed decision depends on, read under the namespace row's FOR SHARE lock."""

    scheduler_epoch: int
    claims_paused: bool
    stage: str


def hold_for_decision(namespace_id: int) -> Held:
    """Inside the caller's transaction: the namespace row FOR SHARE — an advance, a rollback or a fence takes it
    FOR NO KEY UPDATE, so each waits for the decision in flight and every later decision sees it — with the epoch
    and the pause read under that lock, then the stage (every writer of the stage holds the row's NO KEY UPDATE
    lock). Two statements: a join in the locking statement would read the stage from the snapshot taken before the
    lock was waited for — PostgreSQL re-reads only the locked row — so an advance that committed while this waited
    would go unseen."""
    lock = " FOR SHARE" if connection.vendor == "postgresql" else ""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT scheduler_epoch, claims_paused FROM claims_namespace WHERE id = %s{lock}", [namespace_id]
        )
        epoch, paused = cursor.fetchone()
        cursor.execute(
            f"SELECT stage FROM {RolloutState._meta.db_table} WHERE namespace_id = %s", [namespace_id]
        )
        row = cursor.fetchone()
    return Held(epoch, bool(paused), row[0] if row else DEFAULT_STAGE)


def stage_for(ns: core.NamespaceHold, principal: Principal) -> tuple[str, bool]:
    """Under the namespace lock the caller's transaction already holds (``core.Guard.check``): the namespace's
    stage, and whether this worker's protocol was refused there. One statement, after the lock, so it reads what
    every committed stage change and registration left — and holds until the transaction ends: every writer of
    the stage takes the namespace row FOR NO KEY UPDATE, which waits for this FOR SHARE."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT (SELECT stage FROM {RolloutState._meta.db_table} WHERE namespace_id = %s), "
            f"EXISTS (SELECT 1 FROM {WorkerRegistration._meta.db_table} "
            "WHERE principal = %s AND namespace = %s AND refused)",
            [ns.id, principal.name, ns.name],
        )
        stage, refused = cursor.fetchone()
    return stage or DEFAULT_STAGE, bool(refused)


def namespace_create(*, principal: Principal, name: str, stage: str, min_protocol: str) -> Namespace:
    """The core's namespace and the rollout's record of it, in one transaction (a namespace being migrated from
    the legacy table starts at LEGACY)."""
    with transaction.atomic(durable=True):
        namespace = core.namespace_create(principal=principal, name=name)
        RolloutState.objects.create(
            namespace=namespace, stage=stage, min_protocol=min_protocol, updated_at=namespace.created_at
        )
        core.audit(
            principal=principal,
            action="rollout_state_create",
            at=namespace.created_at,
            namespace=name,
            detail={"stage": stage, "min_protocol": min_protocol},
        )
    return namespace


def set_stage(locked: Locked, *, principal: Principal, stage: str, move: str, reason: str = "") -> None:
    """Write the stage decided under ``locked`` — a compare-and-set on the stage read there — and audit it with
    the principal and the kind of ``move`` (``forward``, ``override``, ``rollback``): every stage move is in the
    audit log, whoever drives it. Inside the caller's transaction (advance and rollback decide under the lock, then
    write here)."""
    hold = locked.hold
    with transaction.atomic(savepoint=False):
        changed = RolloutState.objects.filter(pk=hold.id, stage=locked.stage).update(
            stage=stage, updated_at=hold.now
        )
        if (
            not changed
            and locked.stage == DEFAULT_STAGE
            and not RolloutState.objects.filter(pk=hold.id).exists()
        ):
            RolloutState.objects.create(
                namespace_id=hold.id, stage=stage, min_protocol=locked.min_protocol, updated_at=hold.now
            )
            changed = 1
        if not changed:
            raise InvalidTransition(
                f"the stage moved meanwhile (expected {locked.stage})",
                reason="STAGE_CHANGED",
                current={"stage": RolloutState.objects.get(pk=hold.id).stage},
            )
        core.audit(
            principal=principal,
            action="namespace_set_stage",
            at=hold.now,
            namespace=hold.name,
            reason=reason,
            detail={"from": locked.stage, "to": stage, "move": move},
        )
