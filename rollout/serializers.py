from __future__ import annotations

from rest_framework import serializers

from claims.digest import digest
from claims.serializers import (
    DigestField,
    JSONValueField,
    StrictCharField,
    StrictSerializer,
    identifier,
    lease_seconds,
    paginated,
)


class LegacyClaimIn(StrictSerializer):
    owner_id = identifier()
    ttl_seconds = lease_seconds()


class LegacyReleaseIn(StrictSerializer):
    owner_id = identifier()


class LegacyCompleteIn(StrictSerializer):
    owner_id = identifier()
    result = JSONValueField()
    result_digest = DigestField()

    def validate(self, attrs):
        if digest(attrs["result"]) != attrs["result_digest"]:
            raise serializers.ValidationError({"result_digest": ["Does not match the digest of result."]})
        return attrs


class AdvanceIn(StrictSerializer):
    to_stage = serializers.ChoiceField(choices=["LEGACY", "SHADOW", "V1_READS", "V1_WRITES", "V1_ONLY"])
    reason = serializers.CharField(max_length=2000, allow_blank=True, required=False, default="")
    override = serializers.BooleanField(required=False, default=False)

    def validate(self, attrs):
        if attrs["override"] and not attrs["reason"].strip():
            raise serializers.ValidationError({"reason": ["An override needs a reason."]})
        return attrs


class RollbackIn(StrictSerializer):
    to_stage = serializers.ChoiceField(choices=["LEGACY", "SHADOW", "V1_READS", "V1_WRITES"])
    reason = serializers.CharField(max_length=2000, min_length=1)
    force = serializers.BooleanField(required=False, default=False)


class ReviewIn(StrictSerializer):
    status = serializers.ChoiceField(choices=["EXPLAINED", "BUG"])
    note = serializers.CharField(max_length=5000, allow_blank=True, required=False, default="")


class ExplainRuleIn(StrictSerializer):
    reason = serializers.ChoiceField(
        choices=[
            "DOUBLE_GRANT",
            "STALE_COMMIT_ACCEPTED",
            "V1_REJECTED_ONLY",
            "LEGACY_REJECTED_ONLY",
            "WINNER_DIFFERS",
        ]
    )
    note = serializers.CharField(max_length=5000, min_length=1)


class WaiveIn(StrictSerializer):
    point = serializers.ChoiceField(choices=["claim", "renew", "release", "effect", "commit"])
    reason = serializers.CharField(max_length=2000, min_length=1)


class RegisterIn(StrictSerializer):
    protocol = serializers.CharField(max_length=32)
    binary_version = serializers.CharField(max_length=100)
    namespace = serializers.CharField(max_length=100, required=False, default="default")


class HeartbeatIn(StrictSerializer):
    namespace = serializers.CharField(max_length=100, required=False, default="default")


class MismatchQuery(serializers.Serializer):
    reason = serializers.CharField(required=False)
    status = serializers.ChoiceField(choices=["OPEN", "EXPLAINED", "BUG"], required=False)
    since = serializers.DateTimeField(required=False)


class MismatchOut(serializers.Serializer):
    id = serializers.IntegerField()
    namespace = serializers.CharField()
    task_id = serializers.CharField()
    operation = serializers.CharField()
    api = serializers.CharField()
    legacy = serializers.JSONField()
    v1 = serializers.JSONField()
    reason = serializers.CharField()
    status = serializers.CharField()
    note = serializers.CharField()
    reviewed_by = serializers.CharField()
    at = serializers.DateTimeField()


MismatchPage = paginated(MismatchOut, "MismatchPage")


class DrainQuery(serializers.Serializer):
    pool = StrictCharField(max_length=100, required=False, allow_blank=True, default="")
