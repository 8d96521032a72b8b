from __future__ import annotations

from django.apps import AppConfig


class ClaimsConfig(AppConfig):
    name = "claims"
    verbose_name = "claim.v1 core"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import (  # noqa: F401  (registers the OpenAPI auth extension)
            checks,  # the deploy checks
            job_signals,
            metrics,
            schema,
            tasks,  # noqa: F401  (registers the jobs a service sends by name: services.dispatching.enqueue)
        )

        metrics.register()
        job_signals.connect()
