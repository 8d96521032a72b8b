"""The gateway's records: the downstream MCP servers an operator configured, the per-tool rules, and one tool call
per effect (its tool, arguments and the result replayed to every repeat). The effect itself — state, payload
digest, history, dispatch intents — lives in the core's ledger (claims.Effect, EffectEvent, DispatchIntent)."""

from __future__ import annotations

from django.db import models
from django.db.models import Q


class Transport(models.TextChoices):
    STDIO = "stdio"
    HTTP = "http"  # Streamable HTTP


class Downstream(models.Model):
    """A downstream MCP server configured in the console (``MCP_DOWNSTREAMS`` in settings adds more, read-only).
    Its tools are exposed as ``<prefix>__<tool>``."""

    name = models.SlugField(max_length=60, unique=True)
    prefix = models.SlugField(max_length=40, unique=True)
    transport = models.CharField(max_length=8, choices=Transport.choices)
    command = models.JSONField(default=list, blank=True)  # stdio: argv
    env = models.JSONField(default=dict, blank=True)  # stdio: extra environment
    url = models.URLField(max_length=500, blank=True, default="")  # http
    call_timeout_seconds = models.FloatField(default=30.0)
    # Trust the server's readOnlyHint (an untrusted hint otherwise: unannotated and unruled tools are effects).
    trust_annotations = models.BooleanField(default=False)
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField()
    created_by = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(transport__in=Transport.values), name="downstream_transport"),
            models.CheckConstraint(
                condition=Q(call_timeout_seconds__gt=0, call_timeout_seconds__lte=600),
                name="downstream_timeout_range",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class ToolKind(models.TextChoices):
    EFFECT = "EFFECT"  # the default: recorded, sent at most once per slot, replayed to every repeat
    READ_ONLY = "READ_ONLY"  # passed through (recorded or not, by ``record_reads``)
    NON_REPLAYABLE = "NON_REPLAYABLE"  # an effect an operator approves in the console; one at a time per node


class SlotFrom(models.TextChoices):
    CANONICAL = "CANONICAL"  # the tool's name and its canonical arguments: the same call is the same effect
    ARGUMENT = (
        "ARGUMENT"  # the value of one argument (``slot_argument``): another payload there is a conflict
    )
    CALLER = "CALLER"  # the caller must give one (``_meta`` dev.claim-control-plane/effect_slot)


class Occurred(models.TextChoices):
    NOT_ERROR = "NOT_ERROR"  # the query tool answered without isError
    TEXT_CONTAINS = "TEXT_CONTAINS"  # the query's text contains ``occurred_text`` (with $argument references)


class ToolRule(models.Model):
    """How the gateway treats one downstream tool. No rule: an EFFECT with a CANONICAL slot and no query (an
    UNKNOWN outcome waits for an operator's reconcile), or READ_ONLY when the server is trusted and says so."""

    downstream = models.CharField(max_length=60)  # a Downstream name (console or settings)
    tool = models.CharField(max_length=128)
    kind = models.CharField(max_length=16, choices=ToolKind.choices, default=ToolKind.EFFECT)
    record_reads = models.BooleanField(default=False)
    slot_from = models.CharField(max_length=16, choices=SlotFrom.choices, default=SlotFrom.CANONICAL)
    slot_argument = models.CharField(max_length=128, blank=True, default="")
    # Reconcile an UNKNOWN call by asking the same server: a read-only tool, its arguments ("$name" is the call's
    # argument of that name), and when its answer means the call happened.
    query_tool = models.CharField(max_length=128, blank=True, default="")
    query_arguments = models.JSONField(default=dict, blank=True)
    occurred_if = models.CharField(max_length=16, choices=Occurred.choices, default=Occurred.NOT_ERROR)
    occurred_text = models.CharField(max_length=500, blank=True, default="")
    updated_at = models.DateTimeField()
    updated_by = models.CharField(max_length=200, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["downstream", "tool"], name="tool_rule_once"),
            models.CheckConstraint(condition=Q(kind__in=ToolKind.values), name="tool_rule_kind"),
            models.CheckConstraint(condition=Q(slot_from__in=SlotFrom.values), name="tool_rule_slot_from"),
            models.CheckConstraint(
                condition=~Q(slot_from="ARGUMENT") | ~Q(slot_argument=""), name="tool_rule_slot_argument"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.downstream}/{self.tool}"


class ToolCall(models.Model):
    """The tool call behind one effect: what was asked and the downstream's answer, replayed to every repeat of the
    slot. Written when the effect is first prepared by the gateway and when its answer is recorded — the answer in
    the same transaction that moves the effect to COMMITTED or FAILED."""

    effect = models.OneToOneField(
        "claims.Effect", on_delete=models.PROTECT, primary_key=True, related_name="+"
    )
    namespace = models.ForeignKey(
        "claims.Namespace", on_delete=models.PROTECT, related_name="+", db_index=False
    )
    downstream = models.CharField(max_length=60)
    tool = models.CharField(max_length=128)
    arguments = models.JSONField(default=dict)
    arguments_digest = models.CharField(max_length=71)
    result = models.JSONField(null=True, blank=True)  # the CallToolResult as sent to the caller
    is_error = models.BooleanField(default=False)
    sends = models.PositiveIntegerField(
        default=0
    )  # how many times it went downstream (1 but after NOT_OCCURRED)
    created_at = models.DateTimeField()
    answered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [models.Index(fields=["namespace", "-created_at"], name="toolcall_ns_recent")]

    def __str__(self) -> str:
        return f"{self.downstream}/{self.tool}"
