"""Per-principal request rate limit, so one client cannot exhaust the server (API_RATE_LIMIT, e.g. "3000/min").

A fixed window counted with the cache's atomic increment: per process with the default local-memory cache, shared
by every process and host with ``CACHE_URL=redis://…`` (Redis INCR, so concurrent requests in different processes
never lose a count — DRF's own throttle rewrites a list of timestamps, which two processes can overwrite). If the
cache cannot be reached the request is let through and a warning logged: the limit protects the server, it decides
nothing about claims, and a cache outage must not stop the workers."""

from __future__ import annotations

import logging

from django.conf import settings
from rest_framework.throttling import SimpleRateThrottle

logger = logging.getLogger(__name__)


class PrincipalRateThrottle(SimpleRateThrottle):
    scope = "principal"
    num_requests: int | None  # set by SimpleRateThrottle.__init__ from the rate
    duration: int | None

    def get_rate(self) -> str | None:
        return settings.API_RATE_LIMIT or None

    def get_cache_key(self, request, view) -> str | None:
        principal = getattr(request, "user", None)
        name = getattr(principal, "name", None)
        ident = f"p:{name}" if name else f"ip:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}

    def allow_request(self, request, view) -> bool:
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        assert self.num_requests is not None and self.duration is not None
        self.now = self.timer()
        window = int(self.now // self.duration)
        self.resets_at = (window + 1) * self.duration
        counter = f"{key}:{window}"
        try:
            count = self._count(counter)
        except Exception as exc:  # noqa: BLE001 - any cache failure: let the request through, say so
            logger.warning("rate limit not applied: the cache failed (%s: %s)", type(exc).__name__, exc)
            return True
        return count <= self.num_requests

    def _count(self, counter: str) -> int:
        """This request counted in its window; the window's count so far."""
        assert self.duration is not None
        self.cache.add(counter, 0, timeout=self.duration + 1)
        try:
            return self.cache.incr(counter)
        except (
            ValueError
        ):  # the counter expired (or was evicted) between add and incr: this is its first count
            self.cache.set(counter, 1, timeout=self.duration + 1)
            return 1

    def wait(self) -> float:
        return max(0.0, self.resets_at - self.now)
