from __future__ import annotations

from rest_framework import serializers

from claims.models import AuditEntry
from claims.serializers import RowOut, paginated


class FenceOut(serializers.Serializer):
    """The contract's answer, exactly (claim-v1.md); the request and its self-check are in the headers."""

    outcome = serializers.CharField(default="FENCED_EPOCH")
    scheduler_epoch = serializers.IntegerField()
    claims_paused = serializers.BooleanField()


class AuditOut(RowOut):
    detail = serializers.DictField()

    class Meta:
        model = AuditEntry
        fields = ["at", "principal", "role", "action", "namespace", "target", "reason", "detail"]


AuditPage = paginated(AuditOut, "AuditPage")
