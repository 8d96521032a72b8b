"""Plain input and output serializers for the claim.v1 API. They check shape and type only; services decide.

Inputs are strict: a number sent as a string, a boolean where a number belongs, or a field the contract does
not name is a 400 — a misspelt ``expected_state_verison`` silently ignored would turn a guarded claim into an
unguarded one.
"""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings
from django.core.validators import ProhibitNullCharactersValidator
from rest_framework import serializers
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from .digest import DIGEST_RE, canonical_json, digest
from .errors import STATUS_OUTCOMES
from .models import ReplayPolicy, TaskState

MAX_COUNTER = 2**62


class StrictIntegerField(serializers.IntegerField):
    default_error_messages = {"invalid": "A whole number is required (not a string or boolean)."}

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


_SURROGATE = re.compile("[\ud800-\udfff]")


class _NoSurrogates(ProhibitSurrogateCharactersValidator):
    """DRF's check, its message and code, by one regex search rather than a Python loop over every character of
    every string (a sixth of a commit item's validation)."""

    def __call__(self, value: Any) -> None:
        found = _SURROGATE.search(str(value))
        if found:
            raise serializers.ValidationError(
                self.message.format(code_point=ord(found.group())), code=self.code
            )


class _PlainText:
    """For a string field that refuses NUL before its validators run: DRF's NUL validator can never fire, and its
    surrogate validator is swapped for the regex one."""

    validators: list[Any]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.validators = [
            _NoSurrogates() if isinstance(v, ProhibitSurrogateCharactersValidator) else v
            for v in self.validators
            if not isinstance(v, ProhibitNullCharactersValidator)
        ]


class StrictCharField(_PlainText, serializers.CharField):
    default_error_messages = {"invalid": "A string is required.", "nul": "NUL characters are not allowed."}

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        if "\x00" in data:  # PostgreSQL text cannot hold them; refuse before any query
            self.fail("nul")
        return super().to_internal_value(data)


class StrictUUIDField(serializers.UUIDField):
    def to_internal_value(self, data: Any):
        if not isinstance(data, str):
            self.fail("invalid", value=data)
        return super().to_internal_value(data)


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(key) or _has_nul(item) for key, item in value.items())
    if isinstance(value, list):
        return any(_has_nul(item) for item in value)
    return False


class JSONValueField(serializers.JSONField):
    """Any JSON value but null, bounded in size (settings.CLAIMS_MAX_VALUE_BYTES of canonical JSON).

    null is refused (400): a task's result is null exactly when nothing is committed (claim-v1.md, task read), so
    a null input, result or payload would be indistinguishable from "none"."""

    default_error_messages = {
        "null": "May not be null: send a JSON value other than null ({{}} will do).",
    }

    def __init__(self, **kwargs: Any):
        kwargs.setdefault("allow_null", False)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        try:
            size = len(canonical_json(value))
        except (TypeError, ValueError):
            raise serializers.ValidationError("Must be a JSON value.") from None
        if size > settings.CLAIMS_MAX_VALUE_BYTES:
            raise serializers.ValidationError(
                f"At most {settings.CLAIMS_MAX_VALUE_BYTES} bytes of canonical JSON."
            )
        if _has_nul(value):  # jsonb cannot store \u0000 (SQLite could): refuse it on both
            raise serializers.ValidationError("NUL characters (\\u0000) are not allowed in JSON strings.")
        return value


class DigestField(StrictCharField):
    def __init__(self, **kwargs: Any):
        kwargs.setdefault("max_length", 71)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> str:
        value = super().to_internal_value(data)
        if not DIGEST_RE.match(value):
            raise serializers.ValidationError("Must be 'sha256:' followed by 64 lowercase hex digits.")
        return value


def counter(**kwargs: Any) -> StrictIntegerField:
    return StrictIntegerField(min_value=0, max_value=MAX_COUNTER, **kwargs)


def lease_seconds(**kwargs: Any) -> StrictIntegerField:
    return StrictIntegerField(
        min_value=settings.LEASE_MIN_SECONDS, max_value=settings.LEASE_MAX_SECONDS, **kwargs
    )


def identifier(**kwargs: Any) -> StrictCharField:
    return StrictCharField(max_length=200, min_length=1, **kwargs)


# Task ids appear in URL paths (/api/v1/tasks/{task_id}/claim), so they hold no '/', '?', '#' or spaces.
TASK_ID_RE = r"^[A-Za-z0-9][A-Za-z0-9._:@+=~-]*$"


class StrictRegexField(_PlainText, serializers.RegexField):
    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str) or "\x00" in data:
            self.fail("invalid")
        return super().to_internal_value(data)


def task_identifier(**kwargs: Any) -> serializers.RegexField:
    return StrictRegexField(
        TASK_ID_RE,
        max_length=200,
        error_messages={
            "invalid": "Letters, digits and . _ : @ + = ~ - only (it is part of URLs); start with a "
            "letter or digit."
        },
        **kwargs,
    )


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
