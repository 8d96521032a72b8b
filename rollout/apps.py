from __future__ import annotations

from django.apps import AppConfig


class RolloutConfig(AppConfig):
    """Migration scaffolding around the claim.v1 core (legacy store, shadow comparison, gates, drain).
    It wraps the core and the core never imports it. Built in a later issue; empty for now."""

    name = "rollout"
    default_auto_field = "django.db.models.BigAutoField"
