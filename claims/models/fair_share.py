"""Fair share between the keys of a namespace (claim-v1.md §10): each key's weight, and each (priority, key) lane's
virtual time. ``services.fair_share`` stamps a task's place from them; docs/architecture.md explains the method."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class FairnessKey(models.Model):
    """A key's weight in its namespace: the latest one a task gave stands (default 1)."""

    id = models.BigAutoField(primary_key=True)
    namespace = models.ForeignKey("claims.Namespace", on_delete=models.PROTECT, related_name="+")
    key = models.CharField(max_length=64, blank=True)
    weight = models.FloatField(default=1.0)
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["namespace", "key"], name="fairness_key_once"),
            models.CheckConstraint(
                condition=Q(weight__gte=0.001, weight__lte=1000), name="fairness_weight_range"
            ),
        ]


class FairnessLane(models.Model):
    """One key's queue at one priority: the virtual time its last task was stamped with (start-time fair
    queueing: the next starts at the later of this and the lane's priority's virtual time, ``1/weight`` on)."""

    id = models.BigAutoField(primary_key=True)
    namespace = models.ForeignKey("claims.Namespace", on_delete=models.PROTECT, related_name="+")
    priority = models.PositiveSmallIntegerField()
    key = models.CharField(max_length=64, blank=True)
    last_vtag = models.FloatField(default=0.0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["namespace", "priority", "key"], name="fairness_lane_once"),
        ]
        indexes = [
            # A priority's virtual time when it has nothing READY or CLAIMED: where its lanes ended.
            models.Index(fields=["namespace", "priority", "last_vtag"], name="fairness_lane_last"),
        ]
