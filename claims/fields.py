"""The claim.v1 API's strict field types: a number sent as a string, a boolean where a number belongs, a NUL or a
lone surrogate in a string — each a 400, refused before any query (claims/serializers.py uses them)."""

from __future__ import annotations

import math
import re
from typing import Any

from django.conf import settings
from django.core.validators import ProhibitNullCharactersValidator
from rest_framework import serializers
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from .digest import DIGEST_RE, canonical_json

MAX_COUNTER = 2**62


class StrictFloatField(serializers.FloatField):
    default_error_messages = {"invalid": "A number is required (not a string or boolean)."}

    def to_internal_value(self, data: Any) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float) or not math.isfinite(data):
            self.fail("invalid")
        return super().to_internal_value(data)


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


def priority_field(**kwargs: Any) -> StrictIntegerField:
    """claim-v1.md §10: 1 (granted first) to 5."""
    return StrictIntegerField(
        min_value=1, max_value=5, help_text="1 (granted first) to 5; default 3.", **kwargs
    )


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
