"""Strict helpers for settings read from the environment.

A bad value stops start-up with a message that names the variable and what it accepts; a setting is
never silently read as something else (``DEBUG=yes`` is an error, not ``False``).
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"true", "1"}
_FALSE = {"false", "0"}


def env_str(name: str, default: str | None = None) -> str:
    value = os.environ.get(name)
    if value is None or value == "":
        if default is None:
            raise ImproperlyConfigured(f"{name} must be set")
        return default
    return value


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name} must be true/false (or 1/0), got {value!r}")


def env_int(name: str, default: int, *, minimum: int | None = None, maximum: int | None = None) -> int:
    value = os.environ.get(name)
    if value is None or value == "":
        result = default
    else:
        try:
            result = int(value)
        except ValueError:
            raise ImproperlyConfigured(f"{name} must be a whole number, got {value!r}") from None
    if minimum is not None and result < minimum:
        raise ImproperlyConfigured(f"{name} must be at least {minimum}, got {result}")
    if maximum is not None and result > maximum:
        raise ImproperlyConfigured(f"{name} must be at most {maximum}, got {result}")
    return result


def env_list(name: str, default: list[str]) -> list[str]:
    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return list(default)
    return [item.strip() for item in value.split(",") if item.strip()]


def env_json_list(name: str, default: list[dict]) -> list[dict]:
    """A JSON list of objects (``MCP_DOWNSTREAMS='[{"name": "fs", "command": ["…"]}]'``)."""
    import json

    value = os.environ.get(name)
    if value is None or value.strip() == "":
        return list(default)
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name} must be a JSON list of objects: {exc}") from None
    if not isinstance(parsed, list) or not all(isinstance(item, dict) for item in parsed):
        raise ImproperlyConfigured(f"{name} must be a JSON list of objects, got {value[:80]!r}")
    return parsed
