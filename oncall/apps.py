from __future__ import annotations

from django.apps import AppConfig


class OncallConfig(AppConfig):
    """The on-call and operator tools that outlive any migration, beside the claim.v1 core: epoch fences as durable
    requests with their self-check (API, console and CLI alike), resume, the namespace overview, pools, the glance
    page and the audit log. It uses the core; the core never imports it, and it never imports the rollout — an app
    wrapping the core adds its own facts through ``oncall.extensions``."""

    name = "oncall"
    verbose_name = "on-call tools"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import tasks  # noqa: F401 - registers the jobs its services send by name (services.enqueue)
