"""Holding a claim while work runs: its lease renewed in a background thread until the work ends or the lease is
lost for good (FENCED, CANCELLED, EXPIRED)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import httpx

from .errors import ClaimError, ClaimRejected
from .outcomes import Cancelled, Expired, Fenced
from .values import Claim

if TYPE_CHECKING:
    from .client import ControlPlane


class Lease:
    """A claim being held: ``remaining()``, ``check()``, and ``lost`` once renewing failed for good."""

    def __init__(self, cp: ControlPlane, claim: Claim, *, extend_seconds: int, every: float):
        self._cp, self.claim = cp, claim
        self._extend, self._every = extend_seconds, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"renew-{claim.task_id}", daemon=True)
        self.lost: ClaimRejected | None = None
        self.renewals = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._every + 5)

    def remaining(self) -> float:
        return 0.0 if self.lost else self.claim.remaining()

    def check(self) -> None:
        """Raise the loss (Fenced, Cancelled, Expired) if the lease is gone — call it before an expensive step."""
        if self.lost is not None:
            raise self.lost

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self._cp.renew(self.claim, extend_seconds=self._extend)
                self.renewals += 1
            except (Fenced, Cancelled, Expired) as exc:
                self.lost = exc  # stop renewing for good: this attempt is over
                return
            except (httpx.HTTPError, ClaimError):
                continue  # a transient failure: try again while the lease lasts
