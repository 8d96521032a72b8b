"""The on-call forms' template tags."""

from __future__ import annotations

import uuid

from django import template
from django.utils.html import format_html

register = template.Library()


@register.simple_tag
def fence_id_field() -> str:
    """A fence form's own id (``oncall.services.fence`` is idempotent on it): a form submitted twice — a double
    click, a resubmit after a timeout — fences once."""
    return format_html('<input type="hidden" name="fence_id" value="{}">', uuid.uuid4())
