"""A refused console form, field by field (``claims.ui.refused``): the error beside its field, the field marked
invalid and described by it, and what was typed kept. ``form`` names the form on the page (two forms may have a
``reason`` field); each tag says nothing for another form's refusal or when nothing was refused.

    <input name="reason" value="{% typed 'rollback' 'reason' %}" {% invalid 'rollback' 'reason' %}>
    {% field_error 'rollback' 'reason' %}
"""

from __future__ import annotations

from typing import Any

from django import template
from django.utils.html import format_html

register = template.Library()


def _errors(context: Any, form: str) -> dict[str, str] | None:
    refused = context.get("refused")
    return refused["errors"] if refused and refused["form"] == form else None


def _id(form: str, field: str) -> str:
    return f"{form}-{field}-error".replace("_", "-").replace(".", "-")


@register.simple_tag(takes_context=True)
def field_error(context: Any, form: str, field: str) -> str:
    errors = _errors(context, form)
    if not errors or field not in errors:
        return ""
    return format_html('<p class="field-error" id="{}">{}</p>', _id(form, field), errors[field])


@register.simple_tag(takes_context=True)
def invalid(context: Any, form: str, field: str) -> str:
    errors = _errors(context, form)
    if not errors or field not in errors:
        return ""
    return format_html('aria-invalid="true" aria-describedby="{}"', _id(form, field))


@register.simple_tag(takes_context=True)
def typed(context: Any, form: str, field: str, default: Any = "") -> Any:
    refused = context.get("refused")
    if refused and refused["form"] == form:
        return refused["typed"].get(field, "")
    return default


@register.simple_tag(takes_context=True)
def checked_if_typed(context: Any, form: str, field: str) -> str:
    refused = context.get("refused")
    return "checked" if refused and refused["form"] == form and refused["typed"].get(field) else ""


@register.simple_tag(takes_context=True)
def picked(context: Any, form: str, field: str, value: Any) -> str:
    """``checked`` for a ticked box of a refused form's list (``ids``: each mismatch ticked stays ticked)."""
    refused = context.get("refused")
    if refused and refused["form"] == form and str(value) in refused["typed"].getlist(field):
        return "checked"
    return ""
