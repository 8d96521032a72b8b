"""Principals and their bearer tokens. A token is shown once and stored only as its SHA-256."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction

from .. import clock
from ..errors import Invalid
from ..models import Principal, Role, Token
from ..validation import real_text
from ._base import audit

TOKEN_PREFIX = "cp_"


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


# Called once a change commits with a token's key hash (revoked), or None (a principal changed: forget them all):
# the authentication's per-process cache forgets what it remembered.
on_tokens_changed: list[Callable[[str | None], None]] = []


def _tokens_changed(key_hash: str | None) -> None:
    transaction.on_commit(lambda: [forget(key_hash) for forget in on_tokens_changed])


def revocation_reason(reason: str | None) -> str:
    """A revocation's rule, whoever asks: a reason that is real text, trimmed."""
    return real_text(
        reason, why="A revocation needs a reason: whoever holds the token stops working at once."
    )


def token_revoke(*, token_id: int, principal: Principal | None = None, reason: str = "") -> bool:
    """Revoke a token: from now on it authenticates nothing — at once in this process, within
    ``TOKEN_CACHE_SECONDS`` in every other (``claims.auth``). False when it was already revoked. Done by an operator
    (``principal``) it needs a real reason, and is audited with it: the token's holder stops working at once."""
    if principal is not None:
        reason = revocation_reason(reason)
    with transaction.atomic(durable=True):
        token = Token.objects.select_for_update().select_related("principal").filter(pk=token_id).first()
        if token is None or token.revoked_at is not None:
            return False
        token.revoked_at = clock.now()
        token.save(update_fields=["revoked_at"])
        if principal is not None:
            audit(
                principal=principal,
                action="token_revoke",
                at=token.revoked_at,
                target=f"{token.prefix}… of {token.principal.name}",
                reason=reason,
                detail={"holder": token.principal.name, "role": token.principal.role},
            )
        _tokens_changed(token.key_hash)
    return True


@dataclass(frozen=True)
class IssuedToken:
    principal: Principal
    token: str  # the only time the raw token exists outside the client


def token_issue(*, name: str, role: str, pool: str = "") -> IssuedToken:
    """Create the principal if needed (its role and pool must then match) and a new token for it."""
    if role not in Role.values:
        raise Invalid({"role": [f"must be one of {', '.join(Role.values)}"]})
    with transaction.atomic(durable=True):
        now = clock.now()
        principal, created = Principal.objects.get_or_create(
            name=name, defaults={"role": role, "pool": pool, "created_at": now}
        )
        if not created and principal.role != role:
            raise Invalid({"role": [f"principal {name!r} exists with role {principal.role}"]})
        if not created and pool and principal.pool != pool:
            principal.pool = pool
            principal.save(update_fields=["pool"])
            _tokens_changed(None)
        raw = TOKEN_PREFIX + secrets.token_urlsafe(32)
        Token.objects.create(principal=principal, key_hash=hash_token(raw), prefix=raw[:10], created_at=now)
    return IssuedToken(principal=principal, token=raw)


def principal_ensure(*, name: str, role: str) -> Principal:
    """The principal named ``name``, created without a token if there is none (a worker the control plane only
    observes, such as a legacy binary writing its own table: it can never authenticate). Its role must match."""
    with transaction.atomic(durable=True):
        principal, _ = Principal.objects.get_or_create(
            name=name, defaults={"role": role, "pool": "", "created_at": clock.now()}
        )
    if principal.role != role:
        raise Invalid({"role": [f"principal {name!r} exists with role {principal.role}"]})
    return principal


UI_ROLES = ("oncall", "operator", "reviewer")  # strongest first; a user in none of these groups is a viewer


def ui_role(user) -> str:
    """The UI role of a Django user: its strongest group (oncall may do all an operator may)."""
    groups = set(user.groups.values_list("name", flat=True)) if user.is_authenticated else set()
    for role in UI_ROLES:
        if role in groups:
            return role
    return "viewer"


def principal_for_user(user) -> Principal | None:
    """The principal a UI user acts as (``ui:<username>``), kept in step with the user's groups; None for a
    viewer, who may not act."""
    role = ui_role(user)
    if role == "viewer":
        return None
    with transaction.atomic(durable=True):
        principal, created = Principal.objects.get_or_create(
            name=f"ui:{user.get_username()}", defaults={"role": role, "created_at": clock.now()}
        )
        if not created and principal.role != role:
            principal.role = role
            principal.save(update_fields=["role"])
    return principal
