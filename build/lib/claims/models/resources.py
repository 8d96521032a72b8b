"""Protected resources (claim-v1.md §7): fencing tokens scoped to the resource, incarnations, revisions."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q


class ResourceKey(models.Model):
    """A resource's name and what outlives its incarnations: the fence-token counter (never restarts) and who
    took the newest token. Every claim of a task that lists the key takes the next token, in the claim's own
    transaction, so a takeover establishes the new fence before anyone can act."""

    resource_key = models.CharField(max_length=200, primary_key=True)
    fence_token = models.PositiveBigIntegerField(default=0)
    holder_task = models.ForeignKey(
        "claims.Task", null=True, blank=True, on_delete=models.PROTECT, related_name="+", db_constraint=False
    )
    holder_attempt_id = models.UUIDField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(fence_token=0) | Q(holder_attempt_id__isnull=False),
                name="resourcekey_token_has_holder",
            ),
        ]

    def __str__(self) -> str:
        return self.resource_key


class Resource(models.Model):
    """One incarnation of a resource: deleting the key ends it, creating the key again starts a new one at
    revision 0, so evidence from the old incarnation cannot authorise a write to the new."""

    incarnation = models.UUIDField(primary_key=True, default=uuid.uuid4)
    key = models.ForeignKey(ResourceKey, on_delete=models.PROTECT, related_name="incarnations")
    revision = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField()
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            # One live incarnation per key.
            models.UniqueConstraint(
                fields=["key"], condition=Q(deleted_at__isnull=True), name="resource_one_live"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.key_id}@{self.incarnation}"


class TaskResource(models.Model):
    """The resources a task lists, as rows the claim and claim-next queries can join."""

    task = models.ForeignKey("claims.Task", on_delete=models.CASCADE, related_name="resource_links")
    resource_key = models.ForeignKey(ResourceKey, on_delete=models.PROTECT, related_name="task_links")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["task", "resource_key"], name="task_resource_once")]
