"""Deploy checks of our own (``manage.py check --deploy``, ``claimctl check --deploy``), beside Django's."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import checks

# The placeholders our examples ship with (deploy/production.env.example): long and varied enough for Django's own
# check, and known to everyone who read the example.
PLACEHOLDERS = ("change-me",)


@checks.register(checks.Tags.security, deploy=True)
def secret_key_is_not_a_placeholder(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    if any(marker in settings.SECRET_KEY for marker in PLACEHOLDERS):
        return [
            checks.Error(
                "SECRET_KEY is the example's placeholder: every reader of deploy/production.env.example knows it.",
                hint="python -c 'import secrets; print(secrets.token_urlsafe(50))'",
                id="claims.E001",
            )
        ]
    return []
