"""Plain input and output serializers for the claim.v1 API. They check shape and type only; services decide.

Inputs are strict: a number sent as a string, a boolean where a number belongs, or a field the contract does
not name is a 400 — a misspelt ``expected_state_verison`` silently ignored would turn a guarded claim into an
unguarded one.
"""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from .digest import digest
from .errors import STATUS_OUTCOMES
from .fields import (  # noqa: F401  (the field types, by their old names here too)
    MAX_COUNTER,
    TASK_ID_RE,
    DigestField,
    JSONValueField,
    StrictCharField,
    StrictFloatField,
    StrictIntegerField,
    StrictRegexField,
    StrictUUIDField,
    counter,
    identifier,
    lease_seconds,
    priority_field,
    task_identifier,
)
from .models import ReplayPolicy, TaskState


class StrictSerializer(serializers.Serializer):
    """Refuses fields the contract does not name."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(set(data) - set(self.fields))
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


# --- inputs ------------------------------------------------------------------------------------------


class TaskCreateIn(StrictSerializer):
    task_id = task_identifier(required=False)
    namespace = StrictCharField(max_length=100, required=False, default="default")
    node_id = identifier()
    input = JSONValueField()
    depends_on = serializers.ListField(child=task_identifier(), required=False, default=list, max_length=1000)
    replay_policy = serializers.ChoiceField(
        choices=ReplayPolicy.choices, required=False, default=ReplayPolicy.REPLAYABLE
    )
    resources = serializers.ListField(child=identifier(), required=False, default=list, max_length=100)
    priority = priority_field(required=False, default=3)
    fairness_key = StrictCharField(
        max_length=64, required=False, default="", allow_blank=True, help_text="claim-v1.md §10; default ''."
    )
    fairness_weight = StrictFloatField(
        min_value=0.001,
        max_value=1000,
        required=False,
        default=None,
        help_text="The key's weight in its namespace; the latest one given stands (default 1). It spaces the "
        "key's tasks placed from then on: a task already waiting keeps its place.",
    )


class PriorityIn(StrictSerializer):
    priority = priority_field()
    reason = StrictCharField(max_length=2000, min_length=1)


class TaskInputIn(StrictSerializer):
    input = JSONValueField()


class ReasonIn(StrictSerializer):
    reason = StrictCharField(max_length=2000, min_length=1)


class OptionalReasonIn(StrictSerializer):
    reason = StrictCharField(max_length=2000, required=False, default="", allow_blank=True)


class ClaimIn(StrictSerializer):
    owner_id = identifier()
    scheduler_epoch = counter()
    ttl_seconds = lease_seconds()
    expected_state_version = counter(required=False, allow_null=True, default=None)


MAX_WAIT_SECONDS = 30  # claim-v1.md §9


def wait_seconds() -> StrictIntegerField:
    return StrictIntegerField(
        min_value=0,
        max_value=MAX_WAIT_SECONDS,
        required=False,
        default=0,
        help_text="claim-v1.md §9: when nothing is claimable, wait up to this long for a task to become claimable "
        "(created, released, unblocked, requeued, its lease expired, a resource key it lists freed); 204 after the "
        "wait. Only waiters whose `node_ids` admit the task are woken for it. Each retry authenticates the token "
        "again (a revoked token gets 401, within TOKEN_CACHE_SECONDS). A client that hangs up while waiting keeps "
        "nothing: a claim granted as it went is released (ASGI; under WSGI where the server exposes the client's "
        "socket — runserver, gunicorn — else it runs out its lease).",
    )


class ClaimNextIn(StrictSerializer):
    owner_id = identifier()
    scheduler_epoch = counter()
    ttl_seconds = lease_seconds()
    namespace = StrictCharField(max_length=100, required=False, default="default")
    node_ids = serializers.ListField(child=identifier(), required=False, allow_empty=False, max_length=100)
    wait_seconds = wait_seconds()


class ClaimBatchIn(ClaimNextIn):
    max_tasks = StrictIntegerField(min_value=1, max_value=100)


class RenewIn(StrictSerializer):
    attempt_id = StrictUUIDField()
    claim_generation = counter()
    owner_id = identifier()
    scheduler_epoch = counter()
    cancel_generation = counter()
    extend_seconds = lease_seconds()


class ReleaseIn(StrictSerializer):
    attempt_id = StrictUUIDField()
    claim_generation = counter()
    owner_id = identifier()
    scheduler_epoch = counter()


class StageIn(StrictSerializer):
    attempt_id = StrictUUIDField()
    claim_generation = counter()
    result = JSONValueField()
    result_digest = DigestField()

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if digest(attrs["result"]) != attrs["result_digest"]:
            raise serializers.ValidationError({"result_digest": ["Does not match the digest of result."]})
        return attrs


class CommitResourceIn(StrictSerializer):
    resource_key = identifier()
    incarnation = StrictUUIDField()
    expected_revision = counter()


class CommitIn(StrictSerializer):
    attempt_id = StrictUUIDField()
    scheduler_epoch = counter()
    claim_generation = counter()
    observed_cancel_generation = counter()
    input_digest = DigestField()
    result_digest = DigestField()
    resources = CommitResourceIn(many=True, required=False, default=list)
    result = JSONValueField(
        required=False,
        help_text="claim-v1.md §9: the result inline, staged and committed in the commit's one transaction "
        "(`result_digest` must be its digest). Without it, a result staged earlier is committed.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "result" in attrs and digest(attrs["result"]) != attrs["result_digest"]:
            raise serializers.ValidationError({"result_digest": ["Does not match the digest of result."]})
        return attrs


class CommitItemIn(CommitIn):
    """One item of ``POST /commits``: a commit body with the task it commits, judged on its own."""

    task_id = StrictCharField(max_length=200)


class CommitsIn(StrictSerializer):
    commits = serializers.ListField(
        # Any JSON value is an item here, null included: the envelope's rules are only these (a list of 1 to 100);
        # an item that is not a commit body — null, a number, a list, a body missing a field — is that item's 400.
        child=serializers.JSONField(allow_null=True),
        min_length=1,
        max_length=100,
        help_text="1 to 100 items, each judged alone. The envelope is a 400 for the whole request only when "
        "`commits` is missing, not a list, empty or longer than 100. Any item that is not a valid commit body "
        "(`null`, a number, a string, a list, an object missing a field or with a bad one) is answered as that "
        'item\'s `400` with `task_id` as given (or `""` when it names none), and the other items are judged as '
        "usual.",
    )


# Without the rollout app the service speaks claim.v1 only: a namespace is at the contract's last stage and
# admits claim.v1 workers. These are the contract's words for that; the rollout app widens both fields.
CORE_STAGE = "V1_ONLY"
CORE_PROTOCOL = "claim.v1"


class NamespaceCreateIn(StrictSerializer):
    name = serializers.SlugField(max_length=100)
    stage = serializers.ChoiceField(
        choices=[CORE_STAGE],
        required=False,
        default=CORE_STAGE,
        help_text="Without the rollout app: V1_ONLY.",
    )
    min_protocol = serializers.ChoiceField(
        choices=[CORE_PROTOCOL],
        required=False,
        default=CORE_PROTOCOL,
        help_text="Without the rollout app: claim.v1.",
    )


class TaskListQuery(serializers.Serializer):
    namespace = StrictCharField(max_length=100, required=False)
    state = serializers.ChoiceField(choices=TaskState.choices, required=False)


# --- outputs (for the schema; the APIs build these dicts) --------------------------------------------


class TaskOut(serializers.Serializer):
    task_id = serializers.CharField()
    namespace = serializers.CharField(source="namespace.name")
    node_id = serializers.CharField()
    input = serializers.JSONField()
    input_digest = serializers.CharField()
    depends_on = serializers.ListField(child=serializers.CharField())
    replay_policy = serializers.ChoiceField(choices=ReplayPolicy.choices)
    resources = serializers.ListField(child=serializers.CharField())
    state = serializers.ChoiceField(choices=TaskState.choices)
    state_version = serializers.IntegerField()
    scheduler_epoch = serializers.IntegerField(help_text="The epoch the current claim was granted under.")
    claim_generation = serializers.IntegerField()
    attempt_id = serializers.UUIDField(allow_null=True)
    owner_id = serializers.CharField(allow_null=True)
    lease_expires_at = serializers.DateTimeField(allow_null=True)
    cancel_generation = serializers.IntegerField()
    result_commit_id = serializers.UUIDField(allow_null=True)
    result_digest = serializers.CharField(allow_null=True)
    result = serializers.JSONField(
        allow_null=True, help_text="The canonical result once committed, else null."
    )
    priority = serializers.IntegerField(help_text="claim-v1.md §10: 1 (granted first) to 5.")
    fairness_key = serializers.CharField()
    fairness_weight = serializers.FloatField(help_text="The key's weight when the task took its place.")
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class ClaimOut(serializers.Serializer):
    outcome = serializers.CharField(default="CLAIMED")
    task_id = serializers.CharField()
    attempt_id = serializers.UUIDField()
    scheduler_epoch = serializers.IntegerField()
    claim_generation = serializers.IntegerField()
    cancel_generation = serializers.IntegerField()
    lease_expires_at = serializers.DateTimeField()
    input_digest = serializers.CharField()
    state_version = serializers.IntegerField()
    input = serializers.JSONField()
    fences = serializers.DictField(child=serializers.IntegerField())


class RenewOut(serializers.Serializer):
    outcome = serializers.CharField(default="RENEWED")
    lease_expires_at = serializers.DateTimeField()


class OutcomeOut(serializers.Serializer):
    outcome = serializers.CharField()


class DispatchRecordedOut(serializers.Serializer):
    outcome = serializers.CharField(default="DISPATCH_RECORDED")
    dispatch_id = serializers.UUIDField()


class StageOut(serializers.Serializer):
    outcome = serializers.CharField(default="STAGED")
    staged_result_id = serializers.UUIDField()


class ClaimBatchOut(serializers.Serializer):
    outcome = serializers.CharField(default="CLAIMED")
    claims = ClaimOut(many=True)


class CommitItemOut(serializers.Serializer):
    task_id = serializers.CharField()
    status = serializers.ChoiceField(choices=[200, 400, 403, 404, 409])
    body = serializers.JSONField(help_text="What that single commit would have answered with this status.")


class CommitsOut(serializers.Serializer):
    results = CommitItemOut(many=True)


class CommitOut(serializers.Serializer):
    outcome = serializers.CharField(default="COMMITTED")
    result_commit_id = serializers.UUIDField()
    unblocked = serializers.ListField(child=serializers.CharField())
    staged_result_id = serializers.UUIDField(
        required=False,
        help_text="Present when the result was sent inline (claim-v1.md §9): the staged row committed.",
    )


class EventOut(serializers.Serializer):
    kind = serializers.CharField()
    at = serializers.DateTimeField()
    attempt_id = serializers.UUIDField(allow_null=True)
    claim_generation = serializers.IntegerField(allow_null=True)
    scheduler_epoch = serializers.IntegerField(allow_null=True)
    owner_id = serializers.CharField(allow_null=True)
    principal = serializers.CharField()
    detail = serializers.JSONField()


class DrainOut(serializers.Serializer):
    active_leases = serializers.IntegerField()
    unknown_effects = serializers.IntegerField()
    awaiting_commit = serializers.IntegerField()


class NamespaceOut(serializers.Serializer):
    name = serializers.CharField()
    scheduler_epoch = serializers.IntegerField()
    claims_paused = serializers.BooleanField()
    stage: serializers.Field = serializers.CharField()
    min_protocol: serializers.Field = serializers.CharField()


class NamespaceDetailOut(NamespaceOut):
    drain = DrainOut()


class ResumedOut(NamespaceOut):
    outcome = serializers.CharField(default="RESUMED")


class InvalidOut(serializers.Serializer):
    outcome = serializers.CharField(default="INVALID")
    # A declared field: DRF's metaclass takes it off the class, so it never shadows Serializer.errors at run time.
    errors = serializers.DictField(child=serializers.ListField(child=serializers.CharField()))  # type: ignore[assignment]


class OutcomeWordField(serializers.CharField):
    """A 409's outcome word: documented as the enum of every word the server answers with (claims/schema.py)."""


class ReasonWordField(serializers.CharField):
    """A 409's reason: the enum of every reason (claims/schema.py)."""


class CurrentField(serializers.JSONField):
    """The authoritative values after a 409 (claim-v1.md §2): an object whose known members are typed
    (claims/schema.py); which appear depends on the refusal."""


class ConflictOut(serializers.Serializer):
    outcome = OutcomeWordField()
    reason = ReasonWordField()
    detail = serializers.CharField()
    current = CurrentField()


class ErrorOut(serializers.Serializer):
    outcome = serializers.ChoiceField(
        choices=sorted({w for code, w in STATUS_OUTCOMES.items() if code not in (400, 415)})
    )
    detail = serializers.CharField()


# A model row as an answer: the fields ``Meta.fields`` names, each always present (the schema marks them all
# required, whatever the model's defaults). A comment, not a docstring: the schema would show a docstring.
class RowOut(serializers.ModelSerializer):
    def get_extra_kwargs(self) -> dict[str, Any]:
        extra = super().get_extra_kwargs()
        for name in self.Meta.fields:
            extra.setdefault(name, {}).setdefault("required", True)
        return extra


def paginated(item: type[serializers.Serializer], name: str) -> type[serializers.Serializer]:
    """The schema of a DRF-paginated list: ``{count, next, previous, results: [item]}``."""
    return type(
        name,
        (serializers.Serializer,),
        {
            "count": serializers.IntegerField(
                help_text="Rows in the list, exact up to API_LIST_COUNT_CAP (default 1,000); past that the cap, "
                "with the header `X-Count-Capped: true` (follow `next` to the later pages)."
            ),
            "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True),
            "results": item(many=True),
        },
    )


TaskPage = paginated(TaskOut, "TaskPage")
EventPage = paginated(EventOut, "EventPage")
NamespacePage = paginated(NamespaceOut, "NamespacePage")
