from __future__ import annotations

from rest_framework import serializers

from claims.serializers import paginated


class FenceOut(serializers.Serializer):
    """The contract's answer, exactly (claim-v1.md); the request and its self-check are in the headers."""

    outcome = serializers.CharField(default="FENCED_EPOCH")
    scheduler_epoch = serializers.IntegerField()
    claims_paused = serializers.BooleanField()


class AuditOut(serializers.Serializer):
    at = serializers.DateTimeField()
    principal = serializers.CharField()
    role = serializers.CharField()
    action = serializers.CharField()
    namespace = serializers.CharField()
    target = serializers.CharField()
    reason = serializers.CharField()
    detail = serializers.DictField()


AuditPage = paginated(AuditOut, "AuditPage")
