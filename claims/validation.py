"""Rules an action's input must meet whatever door it came through — the console's forms, the REST API, ``claimctl``
— checked once, by the service that performs the action (the API's serializers check types and shapes first; this is
where what the input means is judged). A failed rule is ``Invalid`` with the field named, before anything is written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .errors import Invalid


def real_text(value: str | None, *, field: str = "reason", why: str) -> str:
    """``value`` with its surrounding whitespace removed; ``Invalid`` naming ``field`` when nothing is left (empty,
    missing, or only spaces — a reason must be real text)."""
    text = (value or "").strip()
    if not text:
        raise Invalid({field: [why]})
    return text


def one_of(value: str | None, choices: list[str] | tuple[str, ...], *, field: str) -> str:
    """``value`` when it is one of ``choices``; ``Invalid`` naming ``field`` otherwise."""
    if value is None or value not in choices:
        raise Invalid({field: [f"Must be one of {', '.join(choices)}."]})
    return value


def all_of(*checks: Callable[[], Any]) -> list[Any]:
    """Each check's value, in order; when any fails, one ``Invalid`` with every failed check's fields (a form then
    shows each error beside its field at once, as the API's 400 lists them)."""
    values, errors = [], {}
    for check in checks:
        try:
            values.append(check())
        except Invalid as exc:
            errors.update(exc.errors)
    if errors:
        raise Invalid(errors)
    return values
