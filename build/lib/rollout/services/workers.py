"""Worker pools: registration with protocol and binary version, heartbeats, and refusal of old binaries (A15)."""

from __future__ import annotations

from django.db import transaction
from django.db.models import QuerySet

from claims import clock, interleave
from claims import services as core
from claims.errors import NotFound
from claims.models import Namespace, Principal

from ..models import Protocol, Stage, WorkerRegistration
from ..selectors import rollout_state as state_of
from .errors import ProtocolTooOld

# Older first; anything not listed is older than both.
_PROTOCOL_RANK: dict[str, int] = {Protocol.LEGACY: 1, Protocol.CLAIM_V1: 2}


def required_protocol(namespace: Namespace) -> str:
    """claim.v1 from V1_WRITES on, or whenever the namespace's min_protocol says so; else legacy."""
    stage, min_protocol = state_of(namespace)
    if stage in (Stage.V1_WRITES, Stage.V1_ONLY) or min_protocol == Protocol.CLAIM_V1:
        return Protocol.CLAIM_V1
    return Protocol.LEGACY


def worker_register(
    *, principal: Principal, protocol: str, binary_version: str, namespace: str = "default"
) -> WorkerRegistration:
    """Register (or re-register) a worker for a namespace. A protocol older than the namespace requires is
    refused with PROTOCOL_TOO_OLD — and recorded, so the worker's claims are refused until it registers again
    with a protocol that is new enough.

    Decided under the lock its record's order depends on: the namespace row FOR SHARE (every stage change takes
    it FOR NO KEY UPDATE first, so one waits for this registration, and this one reads what one committed), then
    the stage and protocol minimum, then the clock, then the write."""
    with transaction.atomic(durable=True):
        hold = core.hold_namespace(name=namespace)  # NotFound for an unknown namespace
        ns = Namespace.objects.select_related("rollout").get(pk=hold.id)
        needed = required_protocol(ns)
        too_old = _PROTOCOL_RANK.get(protocol, 0) < _PROTOCOL_RANK[needed]
        interleave.reach("worker_register.decided")
        registration, _ = WorkerRegistration.objects.update_or_create(
            principal=principal.name,
            namespace=ns.name,
            defaults={
                "pool": principal.pool,
                "protocol": protocol,
                "binary_version": binary_version,
                "refused": too_old,
                "registered_at": hold.now,
                "last_heartbeat": hold.now,
            },
        )
    if too_old:
        raise ProtocolTooOld(
            f"namespace {ns.name} requires {needed}; {protocol!r} is older",
            current={"stage": state_of(ns)[0], "min_protocol": state_of(ns)[1], "required": needed},
        )
    return registration


def worker_heartbeat(*, principal: Principal, namespace: str = "default") -> WorkerRegistration:
    with transaction.atomic(durable=True):
        registration = (
            WorkerRegistration.objects.select_for_update()
            .filter(principal=principal.name, namespace=namespace)
            .first()
        )
        if registration is None:
            raise NotFound("register first")
        if registration.refused:
            raise ProtocolTooOld(
                "this worker's protocol was refused: register again with a newer one",
                current={"protocol": registration.protocol},
            )
        registration.last_heartbeat = clock.now()
        registration.save(update_fields=["last_heartbeat"])
    return registration


def refused_registrations(principal: Principal) -> QuerySet[WorkerRegistration]:
    """This worker's refused registrations (filter by namespace, or use in an ``Exists``)."""
    return WorkerRegistration.objects.filter(principal=principal.name, refused=True)


def protocol_too_old(stage: str) -> ProtocolTooOld:
    """A refused worker's claims are refused too (409 PROTOCOL_TOO_OLD) until it registers anew."""
    return ProtocolTooOld(
        "this worker registered with a protocol the namespace refuses; register again",
        current={"stage": stage},
    )
