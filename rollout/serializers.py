from __future__ import annotations

from rest_framework import serializers

from claims import serializers as core_s
from claims.digest import digest
from claims.serializers import (
    DigestField,
    JSONValueField,
    RowOut,
    StrictCharField,
    StrictSerializer,
    identifier,
    lease_seconds,
    paginated,
)

from .models import ExplainRule, Protocol, Stage, WorkerRegistration

# --- namespaces, with the rollout's record of them ------------------------------------------------------------


class NamespaceCreateIn(core_s.NamespaceCreateIn):
    stage = serializers.ChoiceField(
        choices=Stage.choices,
        required=False,
        default=Stage.V1_ONLY,
        help_text="A namespace being migrated from the legacy table starts at LEGACY.",
    )
    min_protocol = serializers.ChoiceField(choices=Protocol.choices, required=False, default=Protocol.LEGACY)


class NamespaceOut(core_s.NamespaceOut):
    stage = serializers.ChoiceField(choices=Stage.choices)
    min_protocol = serializers.ChoiceField(choices=Protocol.choices)


class NamespaceDetailOut(NamespaceOut):
    drain = core_s.DrainOut()


NamespacePage = paginated(NamespaceOut, "RolloutNamespacePage")


class ResumedOut(NamespaceOut):
    outcome = serializers.CharField(default="RESUMED")


# --- routed worker answers where legacy decided -----------------------------------------------------------------


class ShadowOut(serializers.Serializer):
    verdict = serializers.CharField(help_text="claim.v1's verdict on the same operation, judged in shadow.")
    reason = serializers.CharField()
    mismatch_id = serializers.IntegerField(allow_null=True)


class LegacyDecidedOut(serializers.Serializer):
    """Where legacy decides (SHADOW, V1_READS): legacy's verdict as ``outcome``, claim.v1's view of the task
    after judging the same operation in shadow (claim fields null where claim.v1 refused)."""

    outcome = serializers.CharField()
    task_id = serializers.CharField()
    input = serializers.JSONField()
    input_digest = serializers.CharField()
    state_version = serializers.IntegerField()
    attempt_id = serializers.UUIDField(allow_null=True)
    scheduler_epoch = serializers.IntegerField(allow_null=True)
    claim_generation = serializers.IntegerField(allow_null=True)
    cancel_generation = serializers.IntegerField()
    lease_expires_at = serializers.DateTimeField(allow_null=True)
    fences = serializers.DictField(child=serializers.IntegerField())
    decided_by = serializers.CharField(default="legacy")
    shadow = ShadowOut()
    result_commit_id = serializers.UUIDField(
        required=False, help_text="commit: when claim.v1 also committed."
    )
    unblocked = serializers.ListField(child=serializers.CharField(), required=False)
    staged_result_id = serializers.UUIDField(
        required=False, help_text="commit with the result inline: the row claim.v1 staged and committed."
    )


class RoutedClaimBatchOut(serializers.Serializer):
    outcome = serializers.CharField(default="CLAIMED")
    claims = serializers.ListField(
        child=serializers.JSONField(),
        help_text="Each exactly a claim-next answer (ClaimNextAnswer): the core's claim, or as legacy decided it.",
    )


class LegacyRefusedOut(core_s.ConflictOut):
    """409 where legacy decides and refuses: legacy's word (HELD, NOT_OWNER) with the shadow fields."""

    decided_by = serializers.CharField(default="legacy")
    shadow = ShadowOut()


class ReadFromOut(core_s.TaskOut):
    read_from = serializers.CharField(
        required=False, help_text="`legacy` in LEGACY and SHADOW: holder, expiry and result are legacy's."
    )


ReadTaskPage = paginated(ReadFromOut, "RolloutTaskPage")

# --- the legacy protocol --------------------------------------------------------------------------------------


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


# --- rollout API outputs -----------------------------------------------------------------------------------------


class GateOut(serializers.Serializer):
    move = serializers.CharField(help_text='"SHADOW → V1_READS"')
    holds = serializers.BooleanField()
    figures = serializers.DictField()
    why = serializers.CharField()
    checked_at = serializers.DateTimeField()
    age_seconds = serializers.FloatField(help_text="How long ago it was recorded.")


class RollbackOut(serializers.Serializer):
    rollback_id = serializers.CharField(source="pk")
    to_stage = serializers.CharField()
    step = serializers.CharField(help_text="FENCING | DRAINING | DONE")
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)


class RolloutOut(serializers.Serializer):
    namespace = serializers.CharField()
    stage = serializers.ChoiceField(choices=Stage.choices)
    next_stage = serializers.CharField(allow_null=True)
    scheduler_epoch = serializers.IntegerField()
    claims_paused = serializers.BooleanField()
    gates = GateOut(many=True, help_text="The next move's gate as last recorded; empty before the first.")
    rollback = RollbackOut(allow_null=True)


class AdvancedOut(serializers.Serializer):
    outcome = serializers.CharField(default="ADVANCED")
    stage = serializers.ChoiceField(choices=Stage.choices)
    gate = GateOut()


class SnapshotOut(serializers.Serializer):
    pool = serializers.CharField(allow_null=True)
    active_leases = serializers.IntegerField()
    unknown_effects = serializers.IntegerField()
    awaiting_commit = serializers.IntegerField()
    legacy_writes_pending = serializers.IntegerField(
        help_text="claim.v1 decisions not yet written through to a legacy table in another database (V1_WRITES)"
    )
    direct_writes = serializers.IntegerField(
        help_text="observe mode: old binaries' writes straight to the legacy table not yet reviewed"
    )
    clean = serializers.BooleanField()
    clean_streak = serializers.IntegerField()
    taken_at = serializers.DateTimeField(
        allow_null=True, help_text="null: no snapshot yet, the counts as they stand"
    )


class RolledBackOut(serializers.Serializer):
    outcome = serializers.CharField(default="ROLLED_BACK")
    stage = serializers.ChoiceField(choices=Stage.choices)
    scheduler_epoch = serializers.IntegerField()


class RollbackStartedOut(serializers.Serializer):
    outcome = serializers.CharField(default="ROLLBACK_STARTED")
    rollback = RollbackOut()
    drain = SnapshotOut(allow_null=True)
    scheduler_epoch = serializers.IntegerField()


class ExplainRuleOut(RowOut):
    reason = serializers.CharField()

    class Meta:
        model = ExplainRule
        fields = ["id", "namespace", "reason", "note", "created_by", "created_at"]


class PointCoverageOut(serializers.Serializer):
    validated = serializers.IntegerField()
    total = serializers.IntegerField()
    ratio = serializers.FloatField(allow_null=True)
    waived = serializers.BooleanField()


class CoverageOut(serializers.Serializer):
    window_start = serializers.DateTimeField()
    points = serializers.DictField(child=PointCoverageOut())


class WaiverOut(serializers.Serializer):
    point = serializers.CharField()
    reason = serializers.CharField()
    principal = serializers.CharField()
    at = serializers.DateTimeField()


class PoolWorkerOut(RowOut):
    class Meta:
        model = WorkerRegistration
        fields = ["principal", "namespace", "protocol", "binary_version", "refused", "last_heartbeat"]


class PoolOut(serializers.Serializer):
    pool = serializers.CharField()
    workers = PoolWorkerOut(many=True)


class PoolsOut(serializers.Serializer):
    results = PoolOut(many=True)


class RegisteredOut(RowOut):
    outcome = serializers.CharField(default="REGISTERED")

    class Meta:
        model = WorkerRegistration
        fields = ["outcome", "namespace", "protocol", "pool", "binary_version"]


class WorkerHeartbeatOut(RowOut):
    outcome = serializers.CharField(default="HEARTBEAT")

    class Meta:
        model = WorkerRegistration
        fields = ["outcome", "last_heartbeat"]


# --- the legacy protocol's answers -------------------------------------------------------------------------------


class LegacyClaimedOut(serializers.Serializer):
    owner_id = serializers.CharField()
    expires_at = serializers.DateTimeField()


class LegacyHeartbeatOut(serializers.Serializer):
    expires_at = serializers.DateTimeField(allow_null=True)


class LegacyRefusedConflictOut(core_s.ConflictOut):
    owner_id = serializers.CharField()
    expires_at = serializers.DateTimeField(allow_null=True)
