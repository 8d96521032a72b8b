"""A typed Python client for workers (httpx), speaking claim.v1.

    from claims.client import ControlPlane, Fenced

    cp = ControlPlane("http://127.0.0.1:8000", token, owner_id="worker-a")
    epoch = cp.namespace("default")["scheduler_epoch"]
    claim = cp.claim_next(scheduler_epoch=epoch, ttl_seconds=30)
    with cp.lease(claim) as lease:                 # renews in the background, stops when fenced
        result = compute(claim.input)
        lease.check()                              # raises the loss (Fenced, Cancelled, Expired) if the lease is gone
        if lease.remaining() > 5:                  # seconds left, by this process's monotonic clock
            cp.effect(claim, "notify", {"to": "ops"}, call=send, check=was_sent)
        cp.stage(claim, result)
        cp.commit(claim, result)

Every outcome word is a distinct result or exception: a 409 raises the subclass of ``ClaimRejected`` named after
its outcome (``Fenced``, ``StaleInput``, ``PayloadConflict`` …) carrying ``reason`` and ``current``; 400 raises
``Invalid`` with the field errors, 401 ``Unauthenticated``, 403 ``Forbidden``, 404 ``NotFound``. Effect preparation
returns its outcome (``PREPARED``, ``RECONCILE_REQUIRED``, ``ALREADY_COMMITTED``, ``APPROVAL_REQUIRED``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from .digest import digest

# --- errors ------------------------------------------------------------------------------------------


class ClaimError(Exception):
    """Any answer that is not a success."""

    def __init__(self, status: int, body: dict[str, Any]):
        self.status = status
        self.body = body
        self.outcome: str = body.get("outcome", "")
        self.reason: str = body.get("reason", self.outcome)
        self.detail: str = body.get("detail", "")
        self.current: dict[str, Any] = body.get("current", {})
        super().__init__(f"{status} {self.outcome} ({self.reason}): {self.detail or body}")


class Invalid(ClaimError):
    """400: the request was malformed; ``errors`` maps fields to messages. Nothing changed."""

    @property
    def errors(self) -> dict[str, list[str]]:
        return self.body.get("errors", {})


class Unauthenticated(ClaimError):
    """401: no token, or an unknown one."""


class Forbidden(ClaimError):
    """403: the role may not do this, or the attempt or owner_id is not this worker's."""


class NotFound(ClaimError):
    """404: no such task, effect, resource or namespace."""


class ClaimRejected(ClaimError):
    """409: a protocol rejection. The subclass is the outcome word."""


class Fenced(ClaimRejected):
    """Not (or no longer) the current holder: reason EPOCH, GENERATION, ATTEMPT, OWNER or LEASE_EXPIRED."""


class Cancelled(ClaimRejected):
    pass


class Expired(ClaimRejected):
    """The lease ran out before a renew: claim again."""


class StaleInput(ClaimRejected):
    """The input (or a resource, reason RESOURCE) changed: re-read it and compute again."""


class NotStaged(ClaimRejected):
    pass


class ClaimsPaused(ClaimRejected):
    pass


class VersionMismatch(ClaimRejected):
    pass


class NotClaimable(ClaimRejected):
    """reason STATE, LEASE_LIVE or RESOURCE_HELD."""


class PayloadConflict(ClaimRejected):
    """The effect slot is bound to another payload; ``current`` has the bound digest and state."""


class ApprovalRequired(ClaimRejected):
    pass


class InvalidTransition(ClaimRejected):
    pass


class NotUnknown(ClaimRejected):
    pass


class StaleFence(ClaimRejected):
    pass


class TaskExists(ClaimRejected):
    pass


class NotRevisable(ClaimRejected):
    pass


class NotCancellable(ClaimRejected):
    pass


class NamespaceExists(ClaimRejected):
    pass


class ResourceExists(ClaimRejected):
    pass


_BY_OUTCOME: dict[str, type[ClaimRejected]] = {
    "FENCED": Fenced,
    "CANCELLED": Cancelled,
    "EXPIRED": Expired,
    "STALE_INPUT": StaleInput,
    "NOT_STAGED": NotStaged,
    "CLAIMS_PAUSED": ClaimsPaused,
    "VERSION_MISMATCH": VersionMismatch,
    "NOT_CLAIMABLE": NotClaimable,
    "PAYLOAD_CONFLICT": PayloadConflict,
    "APPROVAL_REQUIRED": ApprovalRequired,
    "INVALID_TRANSITION": InvalidTransition,
    "NOT_UNKNOWN": NotUnknown,
    "STALE_FENCE": StaleFence,
    "TASK_EXISTS": TaskExists,
    "NOT_REVISABLE": NotRevisable,
    "NOT_CANCELLABLE": NotCancellable,
    "NAMESPACE_EXISTS": NamespaceExists,
    "RESOURCE_EXISTS": ResourceExists,
}


class EffectUnknown(Exception):
    """The external call timed out (or its reply was lost): recorded UNKNOWN. Reconcile before calling again."""

    def __init__(self, effect_id: str, cause: BaseException):
        super().__init__(f"effect {effect_id} outcome unknown: {cause!r}")
        self.effect_id = effect_id
        self.__cause__ = cause


class EffectFailed(Exception):
    """Raise it from ``call`` for a definite refusal by the target: recorded FAILED, safe to retry later."""


# --- values ------------------------------------------------------------------------------------------


@dataclass
class Claim:
    task_id: str
    attempt_id: str
    scheduler_epoch: int
    claim_generation: int
    cancel_generation: int
    lease_expires_at: str
    input_digest: str
    state_version: int
    input: Any
    fences: dict[str, int]
    _deadline: float = field(default=0.0, repr=False)  # local monotonic time the lease surely ends by

    def remaining(self) -> float:
        """Seconds of lease left, measured from before the request that granted or renewed it (so never more than
        the server's), by this process's monotonic clock — independent of wall-clock skew."""
        return max(0.0, self._deadline - time.monotonic())


@dataclass(frozen=True)
class Committed:
    result_commit_id: str
    unblocked: list[str]


@dataclass(frozen=True)
class EffectTicket:
    outcome: str  # PREPARED | RECONCILE_REQUIRED | ALREADY_COMMITTED | APPROVAL_REQUIRED
    effect_id: str
    state: str
    payload_digest: str

    @property
    def idempotency_key(self) -> str:
        return self.effect_id


@dataclass(frozen=True)
class EffectResult:
    effect_id: str
    state: str  # COMMITTED (or the state an operator's approval is awaited in)
    called: bool  # whether this call reached the target (False: already committed, or reconciled as OCCURRED)
    value: Any = None


# --- the client --------------------------------------------------------------------------------------


class ControlPlane:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        owner_id: str,
        timeout: float = 10.0,
        transport: httpx.BaseTransport | None = None,
    ):
        self.owner_id = owner_id
        self._http = httpx.Client(
            base_url=base_url.rstrip("/") + "/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ControlPlane:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- transport --
    def _request(self, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        response = self._http.request(method, path, json=body)
        if response.status_code < 400:
            return response
        try:
            payload = response.json()
        except ValueError:
            payload = {"detail": response.text}
        status = response.status_code
        if status == 400:
            raise Invalid(status, payload)
        if status == 401:
            raise Unauthenticated(status, payload)
        if status == 403:
            raise Forbidden(status, payload)
        if status == 404:
            raise NotFound(status, payload)
        if status == 409:
            raise _BY_OUTCOME.get(payload.get("outcome", ""), ClaimRejected)(status, payload)
        raise ClaimError(status, payload)

    def _attempt(self, claim: Claim) -> dict[str, Any]:
        return {
            "attempt_id": claim.attempt_id,
            "claim_generation": claim.claim_generation,
            "scheduler_epoch": claim.scheduler_epoch,
            "owner_id": self.owner_id,
        }

    # -- reads --
    def namespace(self, name: str = "default") -> dict[str, Any]:
        return self._request("GET", f"/namespaces/{name}").json()

    def task(self, task_id: str) -> dict[str, Any]:
        return self._request("GET", f"/tasks/{task_id}").json()

    # -- claims --
    def _claimed(self, body: dict[str, Any], started: float, ttl: int) -> Claim:
        fields = {k: body[k] for k in Claim.__dataclass_fields__ if not k.startswith("_")}
        return Claim(**fields, _deadline=started + ttl)

    def claim(
        self,
        task_id: str,
        *,
        scheduler_epoch: int,
        ttl_seconds: int,
        expected_state_version: int | None = None,
    ) -> Claim:
        started = time.monotonic()
        body = {"owner_id": self.owner_id, "scheduler_epoch": scheduler_epoch, "ttl_seconds": ttl_seconds}
        if expected_state_version is not None:
            body["expected_state_version"] = expected_state_version
        return self._claimed(
            self._request("POST", f"/tasks/{task_id}/claim", body).json(), started, ttl_seconds
        )

    def claim_next(
        self,
        *,
        scheduler_epoch: int,
        ttl_seconds: int,
        namespace: str | None = None,
        node_ids: list[str] | None = None,
    ) -> Claim | None:
        """The oldest claimable task, or None when nothing is claimable."""
        started = time.monotonic()
        body: dict[str, Any] = {
            "owner_id": self.owner_id,
            "scheduler_epoch": scheduler_epoch,
            "ttl_seconds": ttl_seconds,
        }
        if namespace:
            body["namespace"] = namespace
        if node_ids:
            body["node_ids"] = node_ids
        response = self._request("POST", "/claims", body)
        if response.status_code == 204:
            return None
        return self._claimed(response.json(), started, ttl_seconds)

    def renew(self, claim: Claim, *, extend_seconds: int) -> datetime:
        started = time.monotonic()
        body = {
            **self._attempt(claim),
            "cancel_generation": claim.cancel_generation,
            "extend_seconds": extend_seconds,
        }
        answer = self._request("POST", f"/tasks/{claim.task_id}/renew", body).json()
        claim.lease_expires_at = answer["lease_expires_at"]
        claim._deadline = started + extend_seconds
        return datetime.fromisoformat(answer["lease_expires_at"].replace("Z", "+00:00"))

    def release(self, claim: Claim) -> None:
        body = self._attempt(claim)
        self._request("POST", f"/tasks/{claim.task_id}/release", body)
        claim._deadline = 0.0

    def stage(self, claim: Claim, result: Any) -> str:
        body = {
            "attempt_id": claim.attempt_id,
            "claim_generation": claim.claim_generation,
            "result": result,
            "result_digest": digest(result),
        }
        return self._request("POST", f"/tasks/{claim.task_id}/results", body).json()["staged_result_id"]

    def commit(
        self, claim: Claim, result: Any, *, resources: list[dict[str, Any]] | None = None
    ) -> Committed:
        """Commit a staged ``result`` (its digest is computed here). ``resources``: the task's resources, each
        ``{resource_key, incarnation, expected_revision}`` as read before computing."""
        body = {
            "attempt_id": claim.attempt_id,
            "scheduler_epoch": claim.scheduler_epoch,
            "claim_generation": claim.claim_generation,
            "observed_cancel_generation": claim.cancel_generation,
            "input_digest": claim.input_digest,
            "result_digest": digest(result),
        }
        if resources:
            body["resources"] = resources
        answer = self._request("POST", f"/tasks/{claim.task_id}/commit", body).json()
        return Committed(answer["result_commit_id"], answer["unblocked"])

    @contextmanager
    def lease(
        self, claim: Claim, *, extend_seconds: int | None = None, every: float | None = None
    ) -> Iterator[Lease]:
        """Hold ``claim`` while the block runs, renewing in a background thread (every third of the lease by
        default). Renewing stops for good at the first FENCED, CANCELLED or EXPIRED; ``lease.check()`` then raises
        it. Leaving the block stops the thread; it does not release the claim (commit or release does)."""
        extend = extend_seconds or max(1, round(claim.remaining()) or 30)
        holder = Lease(self, claim, extend_seconds=extend, every=every or max(0.2, extend / 3))
        holder.start()
        try:
            yield holder
        finally:
            holder.stop()

    # -- effects --
    def prepare(self, claim: Claim, slot: str, payload: Any) -> EffectTicket:
        body = {
            "task_id": claim.task_id,
            "effect_slot": slot,
            "payload_digest": digest(payload),
            **self._attempt(claim),
        }
        answer = self._request("POST", "/effects/prepare", body).json()
        return EffectTicket(answer["outcome"], answer["effect_id"], answer["state"], answer["payload_digest"])

    def record_outcome(
        self, claim: Claim, effect_id: str, state: str, *, external_ref: str | None = None
    ) -> str:
        body = {"state": state, **self._attempt(claim)}
        if external_ref is not None:
            body["external_ref"] = external_ref
        return self._request("POST", f"/effects/{effect_id}/outcome", body).json()["state"]

    def reconcile(
        self, claim: Claim, effect_id: str, *, occurred: bool, external_ref: str | None = None
    ) -> str:
        body = {"observed": "OCCURRED" if occurred else "NOT_OCCURRED", **self._attempt(claim)}
        if external_ref is not None:
            body["external_ref"] = external_ref
        return self._request("POST", f"/effects/{effect_id}/reconcile", body).json()["state"]

    def dispatch(self, claim: Claim, effect_id: str, payload: Any, *, target: str) -> str:
        body = {"payload": payload, "target": target, **self._attempt(claim)}
        return self._request("POST", f"/effects/{effect_id}/dispatch", body).json()["dispatch_id"]

    def effect_record(self, effect_id: str) -> dict[str, Any]:
        return self._request("GET", f"/effects/{effect_id}").json()

    def effect(
        self,
        claim: Claim,
        slot: str,
        payload: Any,
        *,
        call: Callable[[str], Any],
        check: Callable[[str], bool] | None = None,
    ) -> EffectResult:
        """Run one side effect at most once across attempts: prepare → ``call(idempotency_key)`` → outcome.

        - PREPARED: call the target with the key; its return value is recorded COMMITTED. ``EffectFailed`` from
          ``call`` records FAILED (a definite refusal); a timeout or any other error records UNKNOWN and raises
          ``EffectUnknown`` — never FAILED, since the target may have acted.
        - RECONCILE_REQUIRED (an earlier attempt's outcome is unknown — typically after a takeover): ``check(key)``
          asks the target whether the key was applied. Occurred: reconciled COMMITTED, no call. Not occurred:
          reconciled, then called under the same key. Without ``check`` this raises ``EffectUnknown``.
        - ALREADY_COMMITTED: no call.
        - APPROVAL_REQUIRED: raises ``ApprovalRequired`` (an operator must approve a NON_REPLAYABLE effect).
        - A different payload for the slot raises ``PayloadConflict``.
        """
        ticket = self.prepare(claim, slot, payload)
        key = ticket.idempotency_key
        if ticket.outcome == "ALREADY_COMMITTED":
            return EffectResult(key, "COMMITTED", called=False)
        if ticket.outcome == "APPROVAL_REQUIRED":
            raise ApprovalRequired(
                202, {"outcome": "APPROVAL_REQUIRED", "detail": f"effect {key} awaits approval"}
            )
        if ticket.outcome == "RECONCILE_REQUIRED":
            if check is None:
                raise EffectUnknown(key, RuntimeError("reconcile required and no check given"))
            occurred = bool(check(key))
            state = self.reconcile(claim, key, occurred=occurred)
            if occurred:
                return EffectResult(key, state, called=False)
        try:
            value = call(key)
        except EffectFailed as exc:
            self.record_outcome(claim, key, "FAILED", external_ref=str(exc)[:500] or None)
            raise
        except Exception as exc:  # timeouts, lost replies: the target may have acted
            self.record_outcome(claim, key, "UNKNOWN")
            raise EffectUnknown(key, exc) from exc
        state = self.record_outcome(claim, key, "COMMITTED")
        return EffectResult(key, state, called=True, value=value)


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
