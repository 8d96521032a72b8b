"""fence_check FENCE_ID — run a recorded fence's self-check now, from the terminal (when the job queue is down)."""

from __future__ import annotations

import uuid

from django.core.management.base import BaseCommand, CommandError

from claims.management.commands._common import show
from oncall.models import FenceRequest
from oncall.services import fence_check


class Command(BaseCommand):
    help = (
        "Run the self-check of a recorded fence (an old-epoch commit must be refused) and record its verdict."
    )

    def add_arguments(self, parser):
        parser.add_argument("fence_id")

    def handle(self, *args, fence_id: str, **options):
        try:
            pk = uuid.UUID(fence_id)
        except ValueError:
            raise CommandError(f"not a fence id: {fence_id!r}") from None
        if not FenceRequest.objects.filter(pk=pk).exists():
            raise CommandError(f"no fence request {fence_id}")
        show(self.stdout, fence_check(fence_id=pk).summary())
