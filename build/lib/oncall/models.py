"""The on-call tools' own record: each epoch fence requested, from its request to its self-check."""

from __future__ import annotations

import uuid

from django.db import models


class FenceRequest(models.Model):
    """An on-call's fence request, recorded before its job runs, so that a job killed at any point is run again
    (``resend_fences``) and applies the fence exactly once: the fence carries this id (claims'
    ``epoch_fence(fence_id=…)`` is idempotent on it). Pending → fenced (``scheduler_epoch``) → finished (with the
    self-check's verdict)."""

    fence_id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    namespace = models.CharField(max_length=100)
    reason = models.TextField()
    principal = models.CharField(max_length=200)
    requested_at = models.DateTimeField()
    runs = models.PositiveIntegerField(default=0)  # job runs that started on it (more than one: a resend)
    scheduler_epoch = models.PositiveBigIntegerField(null=True, blank=True)
    self_check = models.JSONField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["namespace", "-requested_at"], name="oncall_fence_request_ns")]

    @property
    def status(self) -> str:
        if self.finished_at:
            return "CHECKED" if (self.self_check or {}).get("ok") else "CHECK_FAILED"
        return "FENCED" if self.scheduler_epoch else "PENDING"

    def summary(self) -> dict:
        return {
            "fence_id": str(self.fence_id),
            "namespace": self.namespace,
            "status": self.status,
            "scheduler_epoch": self.scheduler_epoch,
            "runs": self.runs,
            "self_check": self.self_check,
        }
