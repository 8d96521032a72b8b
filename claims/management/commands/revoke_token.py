from __future__ import annotations

import json

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from claims.errors import ClaimError
from claims.management.commands._common import confirmed
from claims.models import Principal, Role, Token
from claims.services import token_revoke
from claims.services.principals import revocation_reason


class Command(BaseCommand):
    help = (
        "Revoke a bearer token, named by the prefix operators see (its first 10 characters) or by the token itself. "
        "Every process stops accepting it within TOKEN_CACHE_SECONDS."
    )

    def add_arguments(self, parser):
        parser.add_argument("token", help="the token, or its 10-character prefix (cp_…)")
        parser.add_argument(
            "--reason", required=True, help="why: audited (whoever holds it stops working at once)"
        )
        parser.add_argument(
            "--as", dest="principal", required=True, help="the operator or on-call revoking it"
        )
        parser.add_argument("--yes", action="store_true", help="confirm without being asked (scripts)")

    def handle(self, *args, token: str, reason: str, principal: str, **options):
        who = Principal.objects.filter(name=principal, role__in=[Role.OPERATOR, Role.ONCALL]).first()
        if who is None:
            raise CommandError(
                f"--as {principal}: no operator or oncall principal of that name (issue_token)"
            )
        matches = list(
            Token.objects.filter(prefix=token[:10], revoked_at__isnull=True).select_related("principal")
        )
        if len(token) > 10:
            from claims.services import hash_token

            matches = [t for t in matches if t.key_hash == hash_token(token)]
        if not matches:
            raise CommandError("no live token with that prefix")
        if len(matches) > 1:
            raise CommandError(f"{len(matches)} live tokens share that prefix: give the whole token")
        try:
            revocation_reason(reason)  # the service's rule, said before asking to confirm
        except ClaimError as exc:
            raise CommandError(json.dumps(exc.body(), default=str)) from None
        held = matches[0]
        confirmed(
            self.stdout,
            consequence=(
                f"This revokes {held.prefix}… of {held.principal.name} ({held.principal.role}): every process "
                f"refuses it within {settings.TOKEN_CACHE_SECONDS} s, and whoever holds it stops working."
            ),
            answer=held.prefix,
            yes=options.get("yes", False),
        )
        try:
            token_revoke(token_id=matches[0].pk, principal=who, reason=reason)
        except ClaimError as exc:
            raise CommandError(json.dumps(exc.body(), default=str)) from None
        self.stdout.write(
            f"revoked {matches[0].prefix}… of {matches[0].principal.name}; every process refuses it within "
            f"{settings.TOKEN_CACHE_SECONDS} s"
        )
