"""The SDK's exceptions by HTTP status. A 409 raises the subclass of ``ClaimRejected`` named after its outcome word
(``claim_client.outcomes``, generated from the server's own errors), carrying ``reason`` and ``current``."""

from __future__ import annotations

from typing import Any


class ClaimError(Exception):
    """Any answer that is not a success."""

    outcome: str = ""

    def __init__(self, status: int, body: dict[str, Any]):
        self.status = status
        self.body = body
        self.outcome = body.get("outcome", "") or type(self).outcome
        self.reason: str = body.get("reason", self.outcome)
        self.detail: str = body.get("detail", "")
        self.current: dict[str, Any] = body.get("current", {})
        super().__init__(f"{status} {self.outcome} ({self.reason}): {self.detail or body}")


class Invalid(ClaimError):
    """400 INVALID: the request was malformed; ``errors`` maps fields to messages. Nothing changed."""

    outcome = "INVALID"

    @property
    def errors(self) -> dict[str, list[str]]:
        errors: dict[str, list[str]] = self.body.get("errors", {})
        return errors


class Unauthenticated(ClaimError):
    """401 UNAUTHENTICATED: no token, or an unknown or revoked one."""

    outcome = "UNAUTHENTICATED"


class Forbidden(ClaimError):
    """403 FORBIDDEN: the role may not do this, or the attempt or owner_id is not this worker's."""

    outcome = "FORBIDDEN"


class NotFound(ClaimError):
    """404 NOT_FOUND: no such task, effect, resource or namespace."""

    outcome = "NOT_FOUND"


class ClaimRejected(ClaimError):
    """409: a protocol rejection. The subclass is the outcome word."""


class Throttled(ClaimError):
    """429 THROTTLED: this principal's request rate is over the limit; ``retry_after`` seconds. Nothing changed,
    so the SDK retries it (``ControlPlane(retries=...)``)."""

    outcome = "THROTTLED"

    @property
    def retry_after(self) -> float:
        return float(self.body.get("_retry_after", 1))


class Unavailable(ClaimError):
    """503 UNAVAILABLE: the database was unreachable and nothing was decided; safe to send again."""

    outcome = "UNAVAILABLE"


BY_STATUS: dict[int, type[ClaimError]] = {
    400: Invalid,
    401: Unauthenticated,
    403: Forbidden,
    404: NotFound,
    409: ClaimRejected,
    429: Throttled,
    503: Unavailable,
}
