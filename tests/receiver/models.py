"""A downstream service's guard table, as claim_client/receiver.py tells one to declare it."""

from __future__ import annotations

from claim_client.receiver import FenceGuard


class ReportFence(FenceGuard):
    class Meta:
        app_label = "receiver"
