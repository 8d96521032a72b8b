"""fence NAMESPACE --reason … --as ONCALL — an epoch fence with its self-check, from the terminal."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from claims.errors import ClaimError
from claims.management.commands._common import fail, principal, show
from claims.models import Role
from oncall.services import fence_now


class Command(BaseCommand):
    help = "Pause claims and bump the epoch; then check that an old-epoch commit is refused."

    def add_arguments(self, parser):
        parser.add_argument("namespace")
        parser.add_argument("--reason", required=True)
        parser.add_argument("--as", required=True, dest="principal")

    def handle(self, *args, namespace: str, reason: str, principal: str, **options):
        who = principal_or_fail(principal)
        try:
            done = fence_now(principal=who, namespace=namespace, reason=reason)
        except ClaimError as exc:
            raise fail(exc) from None
        show(self.stdout, done.summary())


def principal_or_fail(name: str):
    who = principal(name)
    if who.role != Role.ONCALL:
        raise CommandError(f"{name} is {who.role}: fencing is oncall's")
    return who
