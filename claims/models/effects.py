"""The effect ledger (claim-v1.md §6): one durable record per effect slot, its history, and dispatch intents."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q


class EffectState(models.TextChoices):
    PREPARED = "PREPARED"
    UNKNOWN = "UNKNOWN"
    COMMITTED = "COMMITTED"
    FAILED = "FAILED"


class Effect(models.Model):
    """One external side-effect slot of a task. ``effect_id`` = sha256(task_id, node_id, slot): never the attempt or
    the payload, so every attempt of the task addresses the same record and the same idempotency key."""

    effect_id = models.CharField(max_length=64, primary_key=True)
    task = models.ForeignKey("claims.Task", on_delete=models.PROTECT, related_name="effects")
    namespace = models.ForeignKey("claims.Namespace", on_delete=models.PROTECT, related_name="+")
    node_id = models.CharField(max_length=200)
    effect_slot = models.CharField(max_length=200)
    state = models.CharField(max_length=16, choices=EffectState.choices)
    # Bound by the first PREPARED (compare-and-set); never changes afterwards.
    payload_digest = models.CharField(max_length=71)
    non_replayable = models.BooleanField(default=False)
    approved_at = models.DateTimeField(null=True, blank=True)
    approved_by = models.CharField(max_length=200, blank=True, default="")
    # Set when a dispatch intent is recorded; with state PREPARED/UNKNOWN it makes the node busy.
    dispatched_at = models.DateTimeField(null=True, blank=True)
    external_ref = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["namespace", "state"], name="effect_ns_state"),
            models.Index(fields=["namespace", "node_id"], name="effect_ns_node"),
            # the UNKNOWN backlog (/metrics, drain): as small as the backlog, whatever the ledger's size
            models.Index(fields=["namespace"], condition=Q(state="UNKNOWN"), name="effect_unknown"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=EffectState.values), name="effect_state_valid"),
            models.CheckConstraint(
                condition=Q(approved_at__isnull=True) | Q(non_replayable=True),
                name="effect_approval_only_nonreplayable",
            ),
        ]

    def __str__(self) -> str:
        return self.effect_id


class EffectEvent(models.Model):
    """The effect's full history, append-only: every transition and who caused it."""

    id = models.BigAutoField(primary_key=True)
    effect = models.ForeignKey(Effect, on_delete=models.PROTECT, related_name="history")
    kind = models.CharField(max_length=24)
    from_state = models.CharField(max_length=16, blank=True, default="")
    to_state = models.CharField(max_length=16, blank=True, default="")
    at = models.DateTimeField()
    attempt_id = models.UUIDField(null=True, blank=True)
    claim_generation = models.PositiveBigIntegerField(null=True, blank=True)
    principal = models.CharField(max_length=200, blank=True, default="")
    detail = models.JSONField(default=dict)

    class Meta:
        indexes = [models.Index(fields=["effect", "id"], name="effect_history")]


class DispatchState(models.TextChoices):
    PENDING = "PENDING"  # recorded, not yet sent
    SENDING = "SENDING"  # a deliverer took it (sending_at says when)
    DELIVERED = "DELIVERED"  # the reply was applied to the effect
    SKIPPED = "SKIPPED"  # the effect had left PREPARED/UNKNOWN before delivery


class DispatchIntent(models.Model):
    """The tool gateway's durable commitment to call ``target`` with ``payload`` under the effect's key. Recorded
    in the transaction that checked authority; delivered afterwards by a Celery job."""

    dispatch_id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    effect = models.ForeignKey(Effect, on_delete=models.PROTECT, related_name="dispatches")
    attempt_id = models.UUIDField()
    claim_generation = models.PositiveBigIntegerField()
    payload = models.JSONField()
    target = models.URLField(max_length=2000)
    fence_headers = models.JSONField(default=dict)  # {resource_key: token}
    # Delivered by the process that recorded it (the MCP gateway calls its downstream server in the request), not
    # by the Celery job: recorded SENDING, never resent by a job; one that outlives its sender is marked UNKNOWN.
    inline = models.BooleanField(default=False)
    state = models.CharField(max_length=16, choices=DispatchState.choices, default=DispatchState.PENDING)
    deliveries = models.PositiveIntegerField(default=0)
    outcome = models.CharField(max_length=16, blank=True, default="")
    last_error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField()
    # When the send began: recorded before the first byte leaves (an inline intent is recorded SENDING in the
    # transaction that checked authority, before its sender connects).
    sending_at = models.DateTimeField(null=True, blank=True)
    # The sender's last sign of life during a long call (a progress notification): silence is measured from here.
    heard_at = models.DateTimeField(null=True, blank=True)
    # The sender knows nothing left: no connection could be made (a definite "not sent", unlike a lost answer).
    not_sent = models.BooleanField(default=False)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(state__in=DispatchState.values), name="dispatch_state_valid"),
            # One intent in flight per effect: a repeat returns it instead of recording another.
            models.UniqueConstraint(
                fields=["effect"],
                condition=Q(state__in=["PENDING", "SENDING"]),
                name="dispatch_one_in_flight",
            ),
        ]
