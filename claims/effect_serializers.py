"""The effect and resource endpoints' serializers (claims/effect_apis.py): strict inputs, and the outputs the schema
names."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers

from .models import Effect, EffectEvent
from .serializers import (
    DigestField,
    JSONValueField,
    RowOut,
    StrictCharField,
    StrictSerializer,
    StrictUUIDField,
    counter,
    identifier,
    task_identifier,
)


class AttemptFieldsIn(StrictSerializer):
    attempt_id = StrictUUIDField()
    claim_generation = counter()
    scheduler_epoch = counter()
    owner_id = identifier()


class EffectPrepareIn(AttemptFieldsIn):
    task_id = task_identifier()
    effect_slot = identifier()
    payload_digest = DigestField()


class EffectOutcomeIn(AttemptFieldsIn):
    state = serializers.ChoiceField(choices=["COMMITTED", "UNKNOWN", "FAILED"])
    external_ref = StrictCharField(
        max_length=500, required=False, allow_blank=True, default=None, allow_null=True
    )


class EffectReconcileIn(StrictSerializer):
    """Workers name their attempt (all four fields); operators reconcile without one."""

    observed = serializers.ChoiceField(choices=["OCCURRED", "NOT_OCCURRED"])
    external_ref = StrictCharField(
        max_length=500, required=False, allow_blank=True, default=None, allow_null=True
    )
    attempt_id = StrictUUIDField(required=False, default=None)
    claim_generation = counter(required=False, default=None)
    scheduler_epoch = counter(required=False, default=None)
    owner_id = identifier(required=False, default=None)
    reason = StrictCharField(
        max_length=2000,
        required=False,
        allow_blank=True,
        default="",
        help_text="Why: audited. An operator's NOT_OCCURRED needs one (it sends the effect again).",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        principal = self.context.get("principal")
        if principal is not None and principal.role == "worker":
            missing = [
                f
                for f in ("attempt_id", "claim_generation", "scheduler_epoch", "owner_id")
                if attrs[f] is None
            ]
            if missing:
                raise serializers.ValidationError(
                    {f: ["A worker reconciles as its current attempt."] for f in missing}
                )
        return attrs


class EffectApproveIn(StrictSerializer):
    note = StrictCharField(max_length=2000, required=False, allow_blank=True, default="")


class DispatchTargetField(StrictCharField):
    """An http(s) URL whose host is on settings.DISPATCH_ALLOWED_HOSTS."""

    def to_internal_value(self, data: Any) -> str:
        from urllib.parse import urlsplit

        value = super().to_internal_value(data)
        try:
            parts = urlsplit(value)
            host = parts.hostname
        except ValueError:
            raise serializers.ValidationError("Not a URL.") from None
        if parts.scheme not in ("http", "https") or not host:
            raise serializers.ValidationError("Must be an http(s) URL.")
        if host not in settings.DISPATCH_ALLOWED_HOSTS:
            raise serializers.ValidationError(f"Host {host!r} is not on DISPATCH_ALLOWED_HOSTS.")
        return value


class EffectDispatchIn(AttemptFieldsIn):
    payload = JSONValueField()
    target = DispatchTargetField(max_length=2000)


class ResourceCreateIn(StrictSerializer):
    resource_key = task_identifier()


class ResourceCheckIn(StrictSerializer):
    fence_token = counter()
    incarnation = StrictUUIDField()
    expected_revision = counter(required=False, default=None, allow_null=True)


class EffectOut(serializers.Serializer):
    outcome = serializers.CharField()
    effect_id = serializers.CharField()
    state = serializers.CharField()
    payload_digest = serializers.CharField()
    idempotency_key = serializers.CharField(required=False)


class EffectHistoryOut(RowOut):
    class Meta:
        model = EffectEvent
        fields = [
            "kind",
            "from_state",
            "to_state",
            "at",
            "attempt_id",
            "claim_generation",
            "principal",
            "detail",
        ]


class EffectDetailOut(RowOut):
    task_id = serializers.CharField()
    state = serializers.CharField()
    history = EffectHistoryOut(many=True)

    class Meta:
        model = Effect
        fields = [
            *("effect_id", "task_id", "node_id", "effect_slot", "state", "payload_digest", "non_replayable"),
            *("approved_at", "approved_by", "external_ref", "created_at", "updated_at", "history"),
        ]


class ResourceOut(serializers.Serializer):
    resource_key = serializers.CharField()
    incarnation = serializers.UUIDField()
    revision = serializers.IntegerField()
    fence_token = serializers.IntegerField()
    holder = serializers.DictField(allow_null=True, required=False)
