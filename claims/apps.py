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
            tasks,  # noqa: F401  (registers the jobs a service sends by name: services.enqueue)
        )

        metrics.register()
        job_signals.connect()

        from django.contrib.auth.signals import user_logged_in

        user_logged_in.connect(_principal_at_sign_in, dispatch_uid="claims.principal_at_sign_in")


def _principal_at_sign_in(sender, request, user, **kwargs) -> None:
    """A console user's principal (``ui:<username>``, its role from the user's group) is made or brought in step
    when they sign in — a POST — so that a refused action later writes nothing, not even the principal."""
    from .services.principals import principal_for_user

    principal_for_user(user)
