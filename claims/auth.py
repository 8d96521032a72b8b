"""Bearer-token authentication. Tokens are looked up by their SHA-256; the raw token is never stored."""

from __future__ import annotations

import hmac

from rest_framework import authentication, exceptions

from .models import Principal, Token
from .services.principals import hash_token


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request) -> tuple[Principal, Token] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            raise exceptions.AuthenticationFailed("expected 'Authorization: Bearer <token>'")
        raw = raw.strip()
        key_hash = hash_token(raw)
        token = (
            Token.objects.select_related("principal")
            .filter(key_hash=key_hash, revoked_at__isnull=True)
            .first()
        )
        # The lookup is by a hash of a 256-bit secret; the constant-time compare guards the equality itself.
        if token is None or not hmac.compare_digest(token.key_hash, key_hash):
            raise exceptions.AuthenticationFailed("unknown or revoked token")
        return token.principal, token

    def authenticate_header(self, request) -> str:
        return 'Bearer realm="api"'
