"""Typed errors, mapped once to the contract's bodies (claim-v1.md §2).

Services raise these; ``exception_handler`` is the one place that turns them — and DRF's own exceptions —
into HTTP answers:

- 400 ``{"outcome": "INVALID", "errors": {field: [messages]}}``
- 401 / 403 / 404 ``{"outcome": WORD, "detail": text}``
- 409 ``{"outcome": WORD, "reason": WORD, "detail": text, "current": {...}}``
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import Http404
from rest_framework import exceptions as drf
from rest_framework.response import Response


class ClaimError(Exception):
    status = 409
    outcome = "CONFLICT"

    def __init__(
        self,
        detail: str = "",
        *,
        reason: str | None = None,
        current: dict[str, Any] | None = None,
        extra: dict[str, Any] | None = None,
    ):
        super().__init__(detail or self.outcome)
        self.detail = detail or self.outcome
        self.reason = reason or self.outcome
        self.current = current or {}
        # Further documented fields of the answer (a wrapping app's, such as the rollout's shadow verdict).
        self.extra = extra or {}

    def body(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "detail": self.detail}


class Invalid(ClaimError):
    """A request the service can only judge with the database in hand (an unknown depends_on task, say)."""

    status = 400
    outcome = "INVALID"

    def __init__(self, errors: dict[str, list[str]]):
        super().__init__("invalid request")
        self.errors = errors

    def body(self) -> dict[str, Any]:
        return {"outcome": self.outcome, "errors": self.errors}


class NotFound(ClaimError):
    status = 404
    outcome = "NOT_FOUND"


class Forbidden(ClaimError):
    """Authenticated, allowed the endpoint, but not the owner of the attempt or owner_id it names."""

    status = 403
    outcome = "FORBIDDEN"


class Conflict(ClaimError):
    """A protocol rejection: 409 with the contract's outcome word, counted and logged as a `fenced` event."""

    status = 409

    def body(self) -> dict[str, Any]:
        return {
            **self.extra,
            "outcome": self.outcome,
            "reason": self.reason,
            "detail": self.detail,
            "current": self.current,
        }


class Fenced(Conflict):
    outcome = "FENCED"


class Cancelled(Conflict):
    outcome = "CANCELLED"


class Expired(Conflict):
    outcome = "EXPIRED"


class StaleInput(Conflict):
    outcome = "STALE_INPUT"


class NotStaged(Conflict):
    outcome = "NOT_STAGED"


class ClaimsPaused(Conflict):
    outcome = "CLAIMS_PAUSED"


class PauseHeld(Conflict):
    """Resume refused: the pause belongs to a process that has not ended (a rollback draining); it lifts it."""

    outcome = "PAUSE_HELD"


class VersionMismatch(Conflict):
    outcome = "VERSION_MISMATCH"


class NotClaimable(Conflict):
    outcome = "NOT_CLAIMABLE"


class TaskExists(Conflict):
    outcome = "TASK_EXISTS"


class NotRevisable(Conflict):
    outcome = "NOT_REVISABLE"


class NotCancellable(Conflict):
    outcome = "NOT_CANCELLABLE"


class InvalidTransition(Conflict):
    outcome = "INVALID_TRANSITION"


class NamespaceExists(Conflict):
    outcome = "NAMESPACE_EXISTS"


class ResourceExists(Conflict):
    outcome = "RESOURCE_EXISTS"


class StaleFence(Conflict):
    outcome = "STALE_FENCE"


class PayloadConflict(Conflict):
    outcome = "PAYLOAD_CONFLICT"


class ApprovalRequired(Conflict):
    outcome = "APPROVAL_REQUIRED"


class NotUnknown(Conflict):
    outcome = "NOT_UNKNOWN"


# --- the vocabulary of refusals, for the schema and the SDK ---------------------------------------------------

# Reasons the core gives beside its outcome words (a reason defaults to the outcome word itself).
CORE_REASONS = (
    "EPOCH",
    "GENERATION",
    "ATTEMPT",
    "OWNER",
    "LEASE_EXPIRED",
    "STATE",
    "LEASE_LIVE",
    "RESOURCE_HELD",
    "RESOURCE",
    "INCARNATION",
    "REVISION",
    "NODE_BUSY",
    "DISPATCH_IN_FLIGHT",
)
_more_outcomes: set[str] = set()
_more_reasons: set[str] = set()


def register_words(*, outcomes: tuple[str, ...] = (), reasons: tuple[str, ...] = ()) -> None:
    """A wrapping app's further 409 words that no Conflict subclass names as a class attribute (legacy's refusals)
    and its reasons, so the schema's enums and the SDK know them."""
    _more_outcomes.update(outcomes)
    _more_reasons.update(reasons)


def conflict_outcomes() -> list[str]:
    """Every 409 outcome word: each Conflict subclass loaded (the core's and any wrapping app's), and those
    registered."""
    words: set[str] = set(_more_outcomes)
    pending: list[type] = [Conflict]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        outcome = cls.__dict__.get("outcome")
        if isinstance(outcome, str) and cls is not Conflict:
            words.add(outcome)
    return sorted(words)


def conflict_reasons() -> list[str]:
    return sorted({*conflict_outcomes(), *CORE_REASONS, *_more_reasons})


# Outcome words of the answers that are not 409s (claim-v1.md §2; ``exception_handler`` below).
STATUS_OUTCOMES = {
    400: "INVALID",
    401: "UNAUTHENTICATED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    406: "NOT_ACCEPTABLE",
    415: "INVALID",
    429: "THROTTLED",
    503: "UNAVAILABLE",
}


# SQLSTATEs that mean "not now" rather than "never": the database is switching over (its history changed under the
# control plane — ``claims_serving_check()`` — or the node answering is a standby or shutting down).
HISTORY_CHANGED = "P0F01"
_NOT_NOW = {
    HISTORY_CHANGED: "the database failed over; the control plane has checked the new history: retry",
    "25006": "the database node is read-only (a failover is under way): retry",  # read_only_sql_transaction
    "55000": "the database node is a standby (a failover is under way): retry",  # pg_current_wal_lsn() there
    "57P01": "the database is shutting down: retry",
    "57P02": "the database is restarting after a crash: retry",
    "57P03": "the database is starting up: retry",
}
# A statement this connection prepared before a migration changed the columns it returns ("cached plan must not
# change result type": feature_not_supported raised by PostgreSQL's plan cache — told by the function that raised
# it, which lc_messages does not translate): psycopg forgets its prepared statements on the rollback, so the retry
# is served.
_REPREPARE = ("0A000", "RevalidateCachedQuery")


def database_unavailable(exc: BaseException) -> str | None:
    """Why ``exc`` is a database that cannot decide now (restarting, failing over, unreachable), or None.
    Nothing was decided: the transaction rolled back, and the client may send the request again."""
    if not isinstance(exc, DatabaseError):
        return None
    sqlstate = getattr(exc.__cause__, "sqlstate", None)
    if sqlstate in _NOT_NOW:
        return _NOT_NOW[sqlstate]
    if (sqlstate, getattr(getattr(exc.__cause__, "diag", None), "source_function", None)) == _REPREPARE:
        return "the database's tables changed under a prepared statement (a migration): retry"
    if isinstance(exc, (OperationalError, InterfaceError)):
        return "the database is unavailable; retry"
    return None


def history_changed(exc: BaseException) -> bool:
    """``exc`` is a decision refused because the database's history changed (``services.serving``)."""
    return isinstance(exc, DatabaseError) and getattr(exc.__cause__, "sqlstate", None) == HISTORY_CHANGED


def _field_errors(detail: Any) -> dict[str, list[str]]:
    if isinstance(detail, dict):
        return {str(key): _messages(value) for key, value in detail.items()}
    return {"non_field_errors": _messages(detail)}


def _messages(value: Any) -> list[str]:
    if isinstance(value, list):
        out: list[str] = []
        for item in value:
            if isinstance(item, (dict, list)):
                out.extend(f"{msg}" for msg in _flatten(item))
            else:
                out.append(str(item))
        return out
    if isinstance(value, dict):
        return list(_flatten(value))
    return [str(value)]


def _flatten(value: Any, prefix: str = "") -> list[str]:
    if isinstance(value, dict):
        items: list[str] = []
        for key, inner in value.items():
            items.extend(_flatten(inner, f"{prefix}{key}: "))
        return items
    if isinstance(value, list):
        items = []
        for index, inner in enumerate(value):
            items.extend(
                _flatten(inner, f"{prefix}[{index}] " if isinstance(inner, (dict, list)) else prefix)
            )
        return items
    return [f"{prefix}{value}"]


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's EXCEPTION_HANDLER: every answer that is not a success is shaped here."""
    if isinstance(exc, ClaimError):
        return Response(exc.body(), status=exc.status)
    if isinstance(exc, drf.ValidationError):
        return Response({"outcome": "INVALID", "errors": _field_errors(exc.detail)}, status=400)
    if isinstance(exc, drf.ParseError):
        return Response({"outcome": "INVALID", "errors": {"body": [str(exc.detail)]}}, status=400)
    if isinstance(exc, (drf.NotAuthenticated, drf.AuthenticationFailed)):
        response = Response({"outcome": "UNAUTHENTICATED", "detail": str(exc.detail)}, status=401)
        response["WWW-Authenticate"] = 'Bearer realm="api"'
        return response
    if isinstance(exc, (drf.PermissionDenied, DjangoPermissionDenied)):
        detail = str(getattr(exc, "detail", "")) or "your role may not do this"
        return Response({"outcome": "FORBIDDEN", "detail": detail}, status=403)
    if isinstance(exc, (drf.NotFound, Http404)):
        return Response({"outcome": "NOT_FOUND", "detail": "not found"}, status=404)
    if isinstance(exc, drf.MethodNotAllowed):
        return Response({"outcome": "METHOD_NOT_ALLOWED", "detail": str(exc.detail)}, status=405)
    if isinstance(exc, drf.UnsupportedMediaType):
        return Response({"outcome": "INVALID", "errors": {"body": [str(exc.detail)]}}, status=415)
    if isinstance(exc, drf.NotAcceptable):
        return Response({"outcome": "NOT_ACCEPTABLE", "detail": str(exc.detail)}, status=406)
    unavailable = database_unavailable(exc)
    if unavailable:
        # The database is unreachable, restarting or failing over: the transaction rolled back, so the client may
        # retry. A 503, not a 500 — and never a partial decision.
        response = Response({"outcome": "UNAVAILABLE", "detail": unavailable}, status=503)
        response["Retry-After"] = "1"
        response.history_changed = history_changed(exc)  # type: ignore[attr-defined]  # DatabaseFailover acts on it
        return response
    if isinstance(exc, drf.Throttled):
        response = Response({"outcome": "THROTTLED", "detail": str(exc.detail)}, status=429)
        response["Retry-After"] = str(max(1, round(getattr(exc, "wait", None) or 1)))
        return response
    return None
