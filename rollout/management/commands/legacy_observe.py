"""``manage.py legacy_observe``: observe mode (docs/adopting.md) — the team's workers keep writing their table; this
follows its changes (PostgreSQL: logical decoding; MySQL/MariaDB: polling a 'changed' column) and judges each legacy
decision with claim.v1 in shadow. ``--setup`` runs the pre-flight and creates what is missing (the publication, the slot); then it observes,
every ``--interval`` seconds, until stopped (``--once``: one pass). A pass that fails on a database error (ours
failing over, theirs restarting) is tried again on new connections: it resumes from the recorded position. A pass
that met our database's new history (a failover) records it first (``serving_check``: the fence, where one is due). The
``rollout.observe_legacy`` job does one pass on beat's schedule where ``ROLLOUT_LEGACY_OBSERVE`` is on."""

from __future__ import annotations

import contextlib
import time

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connections

from claims.errors import ClaimError, history_changed
from claims.management.commands._common import confirmed, fail
from claims.models import Principal
from claims.services.serving import serving_check
from rollout.services import observe, observers


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser):
        parser.add_argument(
            "--setup", action="store_true", help="pre-flight, then the publication and the slot"
        )
        parser.add_argument(
            "--resnapshot",
            metavar="REASON",
            help="the slot was invalidated (wal_status lost) or dropped: a new one, the gap audited (oncall's)",
        )
        parser.add_argument("--as", dest="principal", help="the oncall principal running --resnapshot")
        parser.add_argument("--yes", action="store_true", help="confirm --resnapshot without being asked")
        parser.add_argument("--once", action="store_true", help="one pass, then exit")
        parser.add_argument("--interval", type=float, default=1.0, help="seconds between passes")
        parser.add_argument(
            "--limit", type=int, default=1000, help="changes read per pass (whole transactions)"
        )

    def handle(self, *args, setup=False, once=False, interval=1.0, limit=1000, resnapshot=None, **options):
        try:
            if resnapshot is not None:  # an empty reason is refused, never read as 'observe'
                who = Principal.objects.filter(name=options["principal"] or "").first()
                if who is None:
                    raise CommandError(
                        "--resnapshot needs --as NAME, an oncall principal (issue_token --role oncall)"
                    )
                observe.resnapshot_allowed(principal=who, reason=resnapshot)
                confirmed(
                    self.stdout,
                    consequence=(
                        "A resnapshot starts a new slot: the legacy decisions between the last one judged and the "
                        "new slot's start are never judged (the gap is audited)."
                    ),
                    answer="resnapshot",
                    yes=options.get("yes", False),
                )
                position = observe.resnapshot(principal=who, reason=resnapshot)
                self.stdout.write(
                    f"a new slot {position.name}; the gap is in the audit log (observer_resnapshot)"
                )
            elif setup:
                position = observers.setup()
                self.stdout.write(f"observing from {position.lsn} (slot {position.name})")
            retries_left = (
                3  # --once: passes that met our database's new history, tried again once it is recorded
            )
            while True:
                try:
                    counts = observers.once(limit=limit)
                except DatabaseError as exc:  # a database restarting or failing over: connect again, go on
                    switched = history_changed(exc)
                    if switched:
                        retries_left -= 1
                    if once and (not switched or retries_left < 0):
                        raise
                    self.stderr.write(f"the pass failed ({type(exc).__name__}: {exc}); connecting again")
                    connections.close_all()  # the next pass opens new ones; the position is in our database
                    if (
                        switched
                    ):  # our database failed over: its new history recorded (and fenced where it must)
                        with contextlib.suppress(DatabaseError):
                            serving_check()
                    time.sleep(interval)
                    continue
                if "skipped" in counts:  # another pass (the beat job, another command) holds the lock
                    if once:
                        raise CommandError("another observer is running a pass; try again")
                    time.sleep(interval)
                    continue
                if counts["read"] or once:
                    self.stdout.write(
                        f"{counts['read']} read, {counts['judged']} legacy decisions judged, "
                        f"{counts['unknown']} of tasks claim.v1 does not have"
                    )
                if once:
                    return
                time.sleep(interval)
        except (observe.ObserveRefused, ImproperlyConfigured) as exc:
            raise CommandError(str(exc)) from None
        except ClaimError as exc:
            raise fail(exc) from None
