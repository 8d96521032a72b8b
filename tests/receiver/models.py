"""A downstream service's guard table, as claims/receiver.py tells one to declare it."""

from __future__ import annotations

from claims.receiver import FenceGuard


class ReportFence(FenceGuard):
    class Meta:
        app_label = "receiver"
