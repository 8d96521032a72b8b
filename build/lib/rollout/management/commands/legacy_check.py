"""``manage.py legacy_check``: the legacy table mapping (ROLLOUT_LEGACY_TABLE) checked against the live table before
anything is routed to it — the table and every mapped column exist, their types fit, the key is unique, the rights
the adapter needs are there, and a sample reads. Changes nothing. Exits non-zero with what to change."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from rollout import legacy_check


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument(
            "--mapping", default=None, help="a mapping (JSON or a file's path) instead of the setting"
        )
        parser.add_argument(
            "--observe",
            action="store_true",
            help="also the change stream's pre-flight (observe mode): wal_level, REPLICATION, replica identity, "
            "the publication's columns, the slot — or, on MySQL/MariaDB, the polling observer's 'changed' column",
        )

    def handle(self, *args, mapping=None, observe=False, **options):
        try:
            report = legacy_check.check(mapping, observe=observe)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        for line in report.passed:
            self.stdout.write(f"ok    {line}")
        for line in report.problems:
            self.stdout.write(f"FIX   {line}")
        if report.problems:
            raise CommandError(f"{len(report.problems)} to fix before the legacy table can be used")
        self.stdout.write(self.style.SUCCESS(f"the mapping fits {report.table} ({report.rows} rows sampled)"))
