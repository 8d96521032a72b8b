"""Per-principal request rate limit, so one client cannot exhaust the server (API_RATE_LIMIT, e.g. "3000/min").
Counted in the configured cache: per process with the default local-memory cache; point CACHES at Redis to share
the budget between processes."""

from __future__ import annotations

from django.conf import settings
from rest_framework.throttling import SimpleRateThrottle


class PrincipalRateThrottle(SimpleRateThrottle):
    scope = "principal"

    def get_rate(self) -> str | None:
        return settings.API_RATE_LIMIT or None

    def get_cache_key(self, request, view) -> str | None:
        principal = getattr(request, "user", None)
        name = getattr(principal, "name", None)
        ident = f"p:{name}" if name else f"ip:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}
