from __future__ import annotations

from django.apps import AppConfig


class RolloutConfig(AppConfig):
    """The migration from the legacy claim table around the claim.v1 core: the rollout's own record of each
        namespace (stage, protocol minimum), routing by stage, the legacy store and API, shadow comparison, gates,
        drain and rollback. It wraps the core and uses the on-call tools (``oncall``); neither imports it (``make lint``
    checks)."""

    name = "rollout"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import (  # noqa: F401 - extensions registers what the on-call tools show of it
            extensions,
            metrics,
            tasks,  # noqa: F401 - registers the jobs a service sends by name (claims.services.enqueue)
        )
        from .services import retention  # noqa: F401 - registers the tasks the core's retention must keep

        metrics.register()
