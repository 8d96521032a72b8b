"""Bearer-token authentication. Tokens are looked up by their SHA-256; the raw token is never stored.

A token found is remembered by this process for ``TOKEN_CACHE_SECONDS`` (default 5), so a worker's requests do not
each pay a database lookup: revoking a token (``services.token_revoke``, or ``revoked_at`` set by any means) or
changing its principal takes effect in every process within that bound, and at once in the process that revoked
it. ``TOKEN_CACHE_SECONDS=0`` looks every request up. Unknown tokens are never remembered, so a token issued a
moment ago works at once.
"""

from __future__ import annotations

import hmac
import threading
import time

from django.conf import settings
from rest_framework import authentication, exceptions

from .models import Principal, Token
from .services.principals import hash_token, on_tokens_changed

_MAX_ENTRIES = 10_000


class _TokenCache:
    """key hash → (principal, token, until), per process. Bounded: when full it starts again empty."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[Principal, Token, float]] = {}
        self._lock = threading.Lock()
        self.clock = time.monotonic

    def get(self, key_hash: str) -> tuple[Principal, Token] | None:
        entry = self._entries.get(key_hash)
        if entry is None or entry[2] <= self.clock():
            return None
        return entry[0], entry[1]

    def put(self, key_hash: str, principal: Principal, token: Token) -> None:
        seconds = settings.TOKEN_CACHE_SECONDS
        if seconds <= 0:
            return
        with self._lock:
            if len(self._entries) >= _MAX_ENTRIES:
                self._entries.clear()
            self._entries[key_hash] = (principal, token, self.clock() + seconds)

    def forget(self, key_hash: str | None) -> None:
        with self._lock:
            if key_hash is None:
                self._entries.clear()
            else:
                self._entries.pop(key_hash, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


tokens = _TokenCache()
on_tokens_changed.append(tokens.forget)


def principal_for_token(raw: str) -> tuple[Principal, Token] | None:
    """The principal a raw bearer token acts as, or None for an unknown or revoked one — the lookup every
    authenticated request makes (the API's, and the MCP gateway's), through this process's cache."""
    key_hash = hash_token(raw.strip())
    known = tokens.get(key_hash)
    if known is not None:
        return known
    token = (
        Token.objects.select_related("principal").filter(key_hash=key_hash, revoked_at__isnull=True).first()
    )
    # The lookup is by a hash of a 256-bit secret; the constant-time compare guards the equality itself.
    if token is None or not hmac.compare_digest(token.key_hash, key_hash):
        return None
    tokens.put(key_hash, token.principal, token)
    return token.principal, token


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request) -> tuple[Principal, Token] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            raise exceptions.AuthenticationFailed("expected 'Authorization: Bearer <token>'")
        found = principal_for_token(raw)
        if found is None:
            raise exceptions.AuthenticationFailed("unknown or revoked token")
        return found

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'
