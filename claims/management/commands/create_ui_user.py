from __future__ import annotations

import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create (or update) an operator-console user with a role: viewer, reviewer, operator or oncall."

    def add_arguments(self, parser):
        parser.add_argument("--username", required=True)
        parser.add_argument("--role", required=True, choices=["viewer", "reviewer", "operator", "oncall"])
        parser.add_argument("--password", default=None, help="default: a random one, printed")

    def handle(self, *args, username: str, role: str, password: str | None, **options):
        user, _ = get_user_model().objects.get_or_create(username=username)
        password = password or secrets.token_urlsafe(12)
        user.set_password(password)
        user.save()
        user.groups.set([Group.objects.get(name=role)])
        self.stderr.write(f"{username} is {role}; the password is the last line")
        self.stdout.write(password)
