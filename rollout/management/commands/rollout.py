"""rollout status|advance|rollback — the rollout API for the terminal, audited as the named principal."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from claims.errors import ClaimError
from claims.management.commands._common import fail, principal, show
from claims.models import Namespace
from rollout import selectors
from rollout.models import Rollback
from rollout.services import stages


class Command(BaseCommand):
    help = "Show a namespace's rollout, advance it one stage, or roll it back."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        status = sub.add_parser("status")
        status.add_argument("namespace")
        advance = sub.add_parser("advance")
        advance.add_argument("namespace")
        advance.add_argument("--to", required=True, dest="to_stage")
        advance.add_argument("--reason", default="")
        advance.add_argument("--override", action="store_true")
        advance.add_argument("--as", required=True, dest="principal")
        rollback = sub.add_parser("rollback")
        rollback.add_argument("namespace")
        rollback.add_argument("--to", required=True, dest="to_stage")
        rollback.add_argument("--reason", required=True)
        rollback.add_argument("--force", action="store_true")
        rollback.add_argument("--as", required=True, dest="principal")

    def handle(self, *args, action: str, namespace: str, **options):
        if not Namespace.objects.filter(name=namespace).exists():
            raise CommandError(f"no such namespace: {namespace}")
        try:
            if action == "status":
                gate = stages.evaluate_gate(namespace=namespace)
                ns = Namespace.objects.get(name=namespace)
                running = Rollback.objects.filter(namespace=namespace, finished_at__isnull=True).first()
                show(
                    self.stdout,
                    {
                        "namespace": namespace,
                        "stage": selectors.stage_of(ns),
                        "next_stage": selectors.next_stage(selectors.stage_of(ns)),
                        "scheduler_epoch": ns.scheduler_epoch,
                        "claims_paused": ns.claims_paused,
                        "gate": gate.__dict__ if gate else None,
                        "rollback": {"to_stage": running.to_stage, "step": running.step} if running else None,
                    },
                )
            elif action == "advance":
                stage, gate = stages.advance(
                    principal=principal(options["principal"]),
                    namespace=namespace,
                    to_stage=options["to_stage"],
                    reason=options["reason"],
                    override=options["override"],
                )
                show(self.stdout, {"outcome": "ADVANCED", "stage": stage, "gate": gate.__dict__})
            else:
                rollback = stages.rollback(
                    principal=principal(options["principal"]),
                    namespace=namespace,
                    to_stage=options["to_stage"],
                    reason=options["reason"],
                    force=options["force"],
                )
                done = rollback.finished_at is not None
                show(
                    self.stdout,
                    {
                        "outcome": "ROLLED_BACK" if done else "ROLLBACK_STARTED",
                        "step": rollback.step,
                        "scheduler_epoch": Namespace.objects.get(name=namespace).scheduler_epoch,
                    },
                )
        except ClaimError as exc:
            raise fail(exc) from None
