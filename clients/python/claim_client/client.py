"""A typed Python client for workers (httpx), speaking claim.v1 with its §9 additions.

    from claim_client import ControlPlane, Fenced

    cp = ControlPlane("http://127.0.0.1:8000", token, owner_id="worker-a")
    epoch = cp.namespace("default")["scheduler_epoch"]
    claim = cp.claim_next(scheduler_epoch=epoch, ttl_seconds=30, wait_seconds=20)   # None after 20 s of nothing
    with cp.lease(claim) as lease:                 # renews in the background, stops when fenced
        result = compute(claim.input)
        lease.check()                              # raises the loss (Fenced, Cancelled, Expired) if the lease is gone
        if lease.remaining() > 5:                  # seconds left, by this process's monotonic clock
            cp.effect(claim, "notify", {"to": "ops"}, call=send, check=was_sent)
        cp.commit(claim, result)                   # the result inline: one request stages and commits it

Batches: ``cp.claim_batch(max_tasks=10, ...)`` → a list of claims; ``cp.commit_many([(claim, result), ...])`` →
one ``Committed`` or the raised-type exception per item, in order (each item judged on its own).

Every outcome word is a distinct result or exception: a 409 raises the subclass of ``ClaimRejected`` named after
its outcome (``Fenced``, ``StaleInput``, ``StageNotOpen``, ``ProtocolTooOld``, ``Held`` … — generated from the
server's own errors, ``claim_client.outcomes``) carrying ``reason`` and ``current``; 400 raises ``Invalid`` with the
field errors, 401 ``Unauthenticated``, 403 ``Forbidden``, 404 ``NotFound``, 429 ``Throttled``, 503 ``Unavailable``.
Effect preparation returns its outcome (``PREPARED``, ``RECONCILE_REQUIRED``, ``ALREADY_COMMITTED``,
``APPROVAL_REQUIRED``).

Retries (``retries=3`` by default), only where sending again cannot do harm:

- 429 and 503, on every request: the server decided nothing (503: the transaction rolled back; 429: refused before
  any work); the SDK waits ``Retry-After`` (or a backoff) and sends again.
- A connection that failed before the request was sent (connect errors), on every request: the server never saw it.
- A timeout or a dropped connection *after* sending, only for requests whose repeat answers the same: commit and
  batch commits (a repeat returns the stored answer), stage (the same digest returns the same record), renew (it
  extends the same lease again), reads — and claims: claim, claim-next and batch claims carry an
  ``Idempotency-Key`` new for each call, sent again with every retry of it, so a repeat of a claim that was granted
  answers that grant instead of taking a second task (docs/workers.md, "Retrying a claim"). Never for release (the
  error is raised). Where legacy decides (SHADOW, V1_READS) the server does not use the key: a claim is then sent
  again only when the server never saw it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, cast

import httpx

from .digest import digest
from .errors import BY_STATUS, ClaimError, ClaimRejected
from .lease import Lease
from .outcomes import BY_OUTCOME, ApprovalRequired
from .values import Claim, Committed, EffectFailed, EffectResult, EffectTicket, EffectUnknown


def _error(response: httpx.Response) -> ClaimError:
    """The exception for a non-success answer: by outcome word for a 409, by status otherwise."""
    try:
        payload = response.json()
    except ValueError:
        payload = {"detail": response.text}
    if not isinstance(payload, dict):
        payload = {"detail": payload}
    status = response.status_code
    if status == 429:
        payload["_retry_after"] = response.headers.get("Retry-After", "1")
    if status == 409:
        return BY_OUTCOME.get(payload.get("outcome", ""), ClaimRejected)(status, payload)
    return BY_STATUS.get(status, ClaimError)(status, payload)


def error_of(status: int, body: dict[str, Any]) -> ClaimError:
    """The exception a single request would have raised for ``status`` and ``body`` (a batch item's answer)."""
    if status == 409:
        return BY_OUTCOME.get(body.get("outcome", ""), ClaimRejected)(status, body)
    return BY_STATUS.get(status, ClaimError)(status, body)


# --- the client --------------------------------------------------------------------------------------


class ControlPlane:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        owner_id: str,
        timeout: float = 10.0,
        retries: int = 3,
        transport: httpx.BaseTransport | None = None,
    ):
        self.owner_id = owner_id
        self._retries = retries
        self._timeout = timeout
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
    def _request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        idempotent: bool = False,
        key: str | None = None,
    ) -> httpx.Response:
        """Send, and send again where that can do no harm (the module's docstring). ``key``: the request's
        Idempotency-Key, the same on every retry — the request is then safe to repeat."""
        headers = {"Idempotency-Key": key} if key else None
        idempotent = idempotent or key is not None
        for attempt in range(self._retries + 1):
            last = attempt == self._retries
            try:
                response = self._http.request(method, path, json=body, headers=headers)
            except httpx.ConnectError:
                if last:
                    raise
                time.sleep(self._backoff(attempt))
                continue
            except (httpx.TimeoutException, httpx.RemoteProtocolError, httpx.ReadError):
                if last or not (idempotent or method == "GET"):
                    raise
                time.sleep(self._backoff(attempt))
                continue
            if response.status_code in (429, 503) and not last:
                time.sleep(self._retry_after(response, attempt))
                continue
            break
        if response.status_code < 400:
            return response
        raise _error(response)

    def _backoff(self, attempt: int) -> float:
        return min(5.0, 0.1 * 2.0**attempt)

    def _retry_after(self, response: httpx.Response, attempt: int) -> float:
        try:
            return min(30.0, float(response.headers.get("Retry-After", "")))
        except ValueError:
            return self._backoff(attempt)

    def _attempt(self, claim: Claim) -> dict[str, Any]:
        return {
            "attempt_id": claim.attempt_id,
            "claim_generation": claim.claim_generation,
            "scheduler_epoch": claim.scheduler_epoch,
            "owner_id": self.owner_id,
        }

    # -- reads --
    def namespace(self, name: str = "default") -> dict[str, Any]:
        return cast(dict[str, Any], self._request("GET", f"/namespaces/{name}").json())

    def task(self, task_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self._request("GET", f"/tasks/{task_id}").json())

    # -- tasks --
    def create_task(
        self, node_id: str, input: Any, *, task_id: str | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Create a task (a sub-task, for a worker) and answer it. ``fields``: the create's other fields, as the
        contract names them — ``namespace``, ``depends_on``, ``resources``, ``replay_policy``, and claim-v1.md §10's
        ``priority`` (1, granted first, to 5), ``fairness_key`` and ``fairness_weight``; each left out is the
        server's default (as is one given as None). Without a ``task_id`` one is made here, so a create whose reply
        was lost is sent again safely: the same definition is a repeat, answered with the task."""
        given = {name: value for name, value in fields.items() if value is not None}
        body = {"node_id": node_id, "input": input, "task_id": task_id or uuid.uuid4().hex, **given}
        return cast(dict[str, Any], self._request("POST", "/tasks", body, idempotent=True).json())

    def set_priority(self, task_id: str, priority: int, *, reason: str) -> dict[str, Any]:
        """An operator's change of a task's priority for its next grant (claim-v1.md §10); audited with ``reason``."""
        body = {"priority": priority, "reason": reason}
        return cast(dict[str, Any], self._request("POST", f"/tasks/{task_id}/priority", body).json())

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
        answer = self._request("POST", f"/tasks/{task_id}/claim", body, key=uuid.uuid4().hex)
        return self._claimed(answer.json(), started, ttl_seconds)

    def claim_next(
        self,
        *,
        scheduler_epoch: int,
        ttl_seconds: int,
        namespace: str | None = None,
        node_ids: list[str] | None = None,
        wait_seconds: int = 0,
    ) -> Claim | None:
        """The first claimable task in grant order (priority, then fair share, then oldest), or None when nothing is
        claimable — after waiting up to ``wait_seconds`` (0–30) for one to become claimable, woken by the server as
        soon as one does."""
        started = time.monotonic()
        body = self._claim_body(scheduler_epoch, ttl_seconds, namespace, node_ids, wait_seconds)
        response = self._waiting("/claims", body, wait_seconds)
        if response.status_code == 204:
            return None
        return self._claimed(response.json(), started, ttl_seconds)

    def claim_batch(
        self,
        *,
        max_tasks: int,
        scheduler_epoch: int,
        ttl_seconds: int,
        namespace: str | None = None,
        node_ids: list[str] | None = None,
        wait_seconds: int = 0,
    ) -> list[Claim]:
        """Up to ``max_tasks`` (1–100) claims in one request, each its own attempt; [] when nothing is claimable
        (after ``wait_seconds``)."""
        started = time.monotonic()
        body = self._claim_body(scheduler_epoch, ttl_seconds, namespace, node_ids, wait_seconds)
        body["max_tasks"] = max_tasks
        response = self._waiting("/claims/batch", body, wait_seconds)
        if response.status_code == 204:
            return []
        return [self._claimed(item, started, ttl_seconds) for item in response.json()["claims"]]

    def _claim_body(
        self, epoch: int, ttl: int, namespace: str | None, node_ids: list[str] | None, wait: int
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"owner_id": self.owner_id, "scheduler_epoch": epoch, "ttl_seconds": ttl}
        if namespace:
            body["namespace"] = namespace
        if node_ids:
            body["node_ids"] = node_ids
        if wait:
            body["wait_seconds"] = wait
        return body

    def _waiting(self, path: str, body: dict[str, Any], wait_seconds: int) -> httpx.Response:
        """A claim that may wait: the read timeout covers the wait."""
        key = uuid.uuid4().hex  # one per claim, the same on its retries
        if not wait_seconds:
            return self._request("POST", path, body, key=key)
        saved = self._http.timeout
        self._http.timeout = httpx.Timeout(self._timeout, read=self._timeout + wait_seconds)
        try:
            return self._request("POST", path, body, key=key)
        finally:
            self._http.timeout = saved

    def renew(self, claim: Claim, *, extend_seconds: int) -> datetime:
        started = time.monotonic()
        body = {
            **self._attempt(claim),
            "cancel_generation": claim.cancel_generation,
            "extend_seconds": extend_seconds,
        }
        answer = self._request("POST", f"/tasks/{claim.task_id}/renew", body, idempotent=True).json()
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
        answer = self._request("POST", f"/tasks/{claim.task_id}/results", body, idempotent=True)
        return str(answer.json()["staged_result_id"])

    def commit(
        self,
        claim: Claim,
        result: Any,
        *,
        resources: list[dict[str, Any]] | None = None,
        inline: bool = True,
    ) -> Committed:
        """Commit ``result`` (its digest is computed here). Inline by default (claim-v1.md §9): the result travels
        with the commit and is staged in the commit's transaction — one request; ``inline=False`` commits a result
        staged earlier with ``stage``. ``resources``: the task's resources, each
        ``{resource_key, incarnation, expected_revision}`` as read before computing."""
        answer = self._request(
            "POST",
            f"/tasks/{claim.task_id}/commit",
            self._commit_body(claim, result, resources, inline),
            idempotent=True,
        ).json()
        return Committed(answer["result_commit_id"], answer["unblocked"], answer.get("staged_result_id"))

    def commit_many(
        self, items: list[tuple[Claim, Any]], *, inline: bool = True
    ) -> list[Committed | ClaimError]:
        """Commit up to 100 results in one request (``POST /commits``). Each item is judged and written on its own;
        the answer, in order, is its ``Committed`` or the exception that commit alone would have raised (returned,
        not raised, so one refusal does not hide the others)."""
        body = {
            "commits": [
                {"task_id": claim.task_id, **self._commit_body(claim, result, None, inline)}
                for claim, result in items
            ]
        }
        results = self._request("POST", "/commits", body, idempotent=True).json()["results"]
        return [
            Committed(
                r["body"]["result_commit_id"], r["body"]["unblocked"], r["body"].get("staged_result_id")
            )
            if r["status"] == 200
            else error_of(r["status"], r["body"])
            for r in results
        ]

    def _commit_body(
        self, claim: Claim, result: Any, resources: list[dict[str, Any]] | None, inline: bool
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "attempt_id": claim.attempt_id,
            "scheduler_epoch": claim.scheduler_epoch,
            "claim_generation": claim.claim_generation,
            "observed_cancel_generation": claim.cancel_generation,
            "input_digest": claim.input_digest,
            "result_digest": digest(result),
        }
        if inline:
            body["result"] = result
        if resources:
            body["resources"] = resources
        return body

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
        return str(self._request("POST", f"/effects/{effect_id}/outcome", body).json()["state"])

    def reconcile(
        self, claim: Claim, effect_id: str, *, occurred: bool, external_ref: str | None = None
    ) -> str:
        body = {"observed": "OCCURRED" if occurred else "NOT_OCCURRED", **self._attempt(claim)}
        if external_ref is not None:
            body["external_ref"] = external_ref
        return str(self._request("POST", f"/effects/{effect_id}/reconcile", body).json()["state"])

    def dispatch(self, claim: Claim, effect_id: str, payload: Any, *, target: str) -> str:
        body = {"payload": payload, "target": target, **self._attempt(claim)}
        return str(self._request("POST", f"/effects/{effect_id}/dispatch", body).json()["dispatch_id"])

    def effect_record(self, effect_id: str) -> dict[str, Any]:
        return cast(dict[str, Any], self._request("GET", f"/effects/{effect_id}").json())

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
