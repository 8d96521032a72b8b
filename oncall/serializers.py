from __future__ import annotations

from rest_framework import serializers

from claims.serializers import paginated


class FenceOut(serializers.Serializer):
    outcome = serializers.CharField(default="FENCED_EPOCH")
    scheduler_epoch = serializers.IntegerField()
    claims_paused = serializers.BooleanField()
    fence_id = serializers.UUIDField(
        help_text="The recorded fence request (console: Fences; `manage.py fence`)."
    )
    self_check = serializers.DictField(
        help_text="`{ok, detail}`: an old-epoch commit was sent after the fence and must have come back FENCED "
        "(EPOCH). `ok: false` means the fence must be looked at — the epoch was bumped all the same."
    )


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
