from __future__ import annotations

from django.apps import AppConfig


class GatewayConfig(AppConfig):
    """The fenced MCP tool gateway (docs/mcp.md): agents' MCP ``tools/call`` requests become effects of their claim
    in the core's ledger — checked at the effect acceptance point, recorded before anything is sent downstream,
    replayed instead of sent twice. It uses the core; the core never imports it."""

    name = "gateway"
    verbose_name = "MCP tool gateway"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from claims.ui import effect_labels

        from .selectors import tool_call_labels

        effect_labels(tool_call_labels)
