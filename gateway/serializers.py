"""The gateway's configuration as the REST API and ``claimctl gateway`` take it: one rulebook for both doors (the
console's forms go through the same services, which check what needs the database)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from claims.fields import StrictCharField
from claims.serializers import StrictSerializer

from .models import Occurred, SlotFrom, ToolKind, Transport

NAME = r"^[A-Za-z0-9_-]{1,60}$"


class _Seconds(serializers.FloatField):
    default_error_messages = {"invalid": "A number of seconds is required (not a string or boolean)."}

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return super().to_internal_value(data)


class _Flag(serializers.BooleanField):
    default_error_messages = {"invalid": "true or false is required."}

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class DownstreamIn(StrictSerializer):
    prefix = serializers.RegexField(r"^[A-Za-z0-9_-]{0,40}$", required=False, allow_blank=True, default=None)
    transport = serializers.ChoiceField(choices=Transport.values, required=False, default=None)
    command = serializers.ListField(
        child=StrictCharField(max_length=1000), max_length=100, required=False, default=list
    )
    env = serializers.DictField(
        child=StrictCharField(max_length=4000, allow_blank=True), required=False, default=dict
    )
    url = serializers.URLField(max_length=500, required=False, allow_blank=True, default="")
    call_timeout_seconds = _Seconds(min_value=0.001, max_value=600, required=False, default=30.0)
    trust_annotations = _Flag(required=False, default=False)
    enabled = _Flag(required=False, default=True)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["transport"] is None:
            attrs["transport"] = Transport.STDIO if attrs["command"] else Transport.HTTP
        return attrs


class NamedDownstreamIn(DownstreamIn):
    """One entry of a configuration file: the server's name inside it."""

    name = serializers.RegexField(NAME)


class ToolRuleIn(StrictSerializer):
    kind = serializers.ChoiceField(choices=ToolKind.values, required=False, default=ToolKind.EFFECT)
    record_reads = _Flag(required=False, default=False)
    slot_from = serializers.ChoiceField(choices=SlotFrom.values, required=False, default=SlotFrom.CANONICAL)
    slot_argument = StrictCharField(max_length=128, required=False, allow_blank=True, default="")
    query_tool = StrictCharField(max_length=128, required=False, allow_blank=True, default="")
    query_arguments = serializers.DictField(required=False, default=dict)
    occurred_if = serializers.ChoiceField(choices=Occurred.values, required=False, default=Occurred.NOT_ERROR)
    occurred_text = StrictCharField(max_length=500, required=False, allow_blank=True, default="")


class NamedToolRuleIn(ToolRuleIn):
    downstream = serializers.RegexField(NAME)
    tool = StrictCharField(max_length=128)


class ConfigIn(StrictSerializer):
    """A whole configuration (``claimctl gateway apply FILE``): servers and rules, applied in one go."""

    downstreams = NamedDownstreamIn(many=True, required=False, default=list)
    rules = NamedToolRuleIn(many=True, required=False, default=list)


class DownstreamOut(serializers.Serializer):
    name = serializers.CharField()
    prefix = serializers.CharField()
    transport = serializers.CharField()
    command = serializers.ListField(child=serializers.CharField())
    env = serializers.ListField(
        child=serializers.CharField(), help_text="The variables' names (values may be secrets)."
    )
    url = serializers.CharField()
    call_timeout_seconds = serializers.FloatField()
    trust_annotations = serializers.BooleanField()
    enabled = serializers.BooleanField()
    source = serializers.CharField(  # type: ignore[assignment]
        help_text="`settings` (MCP_DOWNSTREAMS: read-only) or `api` (this API, the console, claimctl)."
    )


class ToolRuleOut(ToolRuleIn):
    downstream = serializers.CharField()
    tool = serializers.CharField()
    source = serializers.CharField(  # type: ignore[assignment]
        help_text="`settings` (MCP_TOOL_RULES) or `api`; an `api` rule wins."
    )
