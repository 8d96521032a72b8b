"""``manage.py legacy_import NAMESPACE --as NAME``: your table's rows of NAMESPACE made claim.v1 tasks, in the
foreground with a progress line per batch — the import entering SHADOW starts as a job (the console shows its
progress), run here instead or to resume one that stopped. Idempotent: a row claim.v1 already has is left as it is.
Then the live claims, as entering SHADOW imports them."""

from __future__ import annotations

import time

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from claims.models import Namespace, Principal, Role
from rollout.models import LegacyImport
from rollout.services import adoption


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument("namespace")
        parser.add_argument("--as", dest="principal", required=True, help="the operator running it (audited)")

    def handle(self, *args, namespace: str, principal: str, **options):
        who = Principal.objects.filter(name=principal).first()
        if who is None or who.role not in (Role.OPERATOR, Role.ONCALL):
            raise CommandError(
                f"--as {principal}: no operator or oncall principal of that name (issue_token)"
            )
        if not Namespace.objects.filter(name=namespace).exists():
            raise CommandError(f"no namespace {namespace!r}")
        try:
            if not adoption.imports_rows():
                raise CommandError(
                    "the legacy store is not a table of yours (ROLLOUT_LEGACY_STORE=rollout.legacy_table."
                    "TableLegacyStore): there are no rows to import"
                )
            job = adoption.start(namespace=namespace, principal=who)
            began, resumed_at = time.monotonic(), job.read
            self.stdout.write(
                f"importing {job.total} rows of {namespace} (import {job.pk}, from key {job.last_key!r})"
            )

            def progress(at: LegacyImport) -> None:
                rate = (at.read - resumed_at) / max(time.monotonic() - began, 1e-6)
                share = f"{100 * at.read / at.total:.0f}%" if at.total else "-"
                self.stdout.write(
                    f"{at.read}/{at.total} rows ({share}), {at.created} tasks made, {rate:.0f} rows/s"
                )

            done = adoption.run(job.pk, progress=progress)
        except (ImproperlyConfigured, DatabaseError) as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(
            f"done: {done.read} rows read, {done.created} tasks made in {time.monotonic() - began:.1f} s; "
            f"live claims {done.claims}"
        )
