from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from claims.errors import Invalid
from claims.models import Role
from claims.services import token_issue


class Command(BaseCommand):
    help = "Create the principal if needed and print a new bearer token for it (the last line of stdout)."

    def add_arguments(self, parser):
        parser.add_argument("--role", required=True, choices=Role.values)
        parser.add_argument("--name", required=True, help="principal name; a worker's name is its owner_id")
        parser.add_argument("--pool", default="", help="worker pool (legacy, v1, ...)")

    def handle(self, *args, role: str, name: str, pool: str, **options):
        try:
            issued = token_issue(name=name, role=role, pool=pool)
        except Invalid as exc:
            raise CommandError("; ".join(f"{k}: {' '.join(v)}" for k, v in exc.errors.items())) from None
        principal = issued.principal
        self.stderr.write(
            f"token for {principal.name} (role {principal.role}, pool {principal.pool or '-'}); "
            "it is shown once and stored only as a hash"
        )
        self.stdout.write(issued.token)
