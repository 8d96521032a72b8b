"""A chaos worker process: claim-next, think, stage, commit — recording every request and answer with
timestamps (JSON lines) for the history checker. It survives what a real worker survives: lost connections,
5xx, fences, pauses."""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import claim_client as sdk  # noqa: E402
import httpx  # noqa: E402

# The most a worker thinks about a task (the bench: 0).
THINK = float(os.environ.get("CHAOS_THINK_SECONDS", "0.4"))
# CHAOS_MIXED=1 (the HA runs): claim-next waits up to a second for work, and a third of the claims are batches of
# up to three, each claim renewed once and all committed in one batch commit.
MIXED = os.environ.get("CHAOS_MIXED") == "1"
WAIT = 1 if MIXED else 0


def main(
    url: str, token: str, owner: str, namespace: str, log_path: str, seconds: float, target: str = ""
) -> None:
    rng = random.Random(owner)
    log = open(log_path, "a", buffering=1)
    cp = sdk.ControlPlane(url, token, owner_id=owner, timeout=5)
    effects = httpx.Client(timeout=2)

    def record(op: str, started: float, **fields) -> None:
        log.write(json.dumps({"op": op, "owner": owner, "t0": started, "t1": time.time(), **fields}) + "\n")

    deadline = time.time() + seconds
    epoch = 1
    while time.time() < deadline:
        started = time.time()
        try:
            if MIXED and rng.random() < 0.3:
                batch(cp, claim_batch_of(cp, epoch, namespace), effects, target, record)
                continue
            claim = cp.claim_next(
                scheduler_epoch=epoch, ttl_seconds=2, namespace=namespace, wait_seconds=WAIT
            )
        except sdk.ClaimRejected as exc:
            record("claim", started, status=exc.status, outcome=exc.outcome, reason=exc.reason)
            try:
                epoch = cp.namespace(namespace)["scheduler_epoch"]
            except (httpx.HTTPError, sdk.ClaimError):
                pass
            time.sleep(0.1)
            continue
        except (httpx.HTTPError, sdk.ClaimError) as exc:
            record("claim", started, status=getattr(exc, "status", 0), outcome="ERROR")
            time.sleep(0.1)
            continue
        if claim is None:
            record("claim", started, status=204, outcome="NONE")
            time.sleep(0.05)
            continue
        record("claim", started, **granted(claim))
        time.sleep(rng.uniform(0, THINK))  # think (a SIGSTOP can land here and outlast the lease)
        kind = (claim.input or {}).get("kind", "plain") if isinstance(claim.input, dict) else "plain"
        if (
            target
            and kind in ("effect", "dispatch")
            and not side_effect(cp, effects, claim, kind, target, record)
        ):
            continue  # the effect's outcome is not known or the attempt was refused: leave the task to a retry
        if kind == "mcp" and not tool_call(url, token, claim, record):
            continue  # refused, or no answer: the tool call's slot is left to a later attempt
        result = {"computed_on": claim.input_digest, "by": owner, "generation": claim.claim_generation}
        for op in ("stage", "commit"):
            started = time.time()
            try:
                if op == "stage":
                    cp.stage(claim, result)
                    record(
                        "stage",
                        started,
                        status=201,
                        outcome="STAGED",
                        task_id=claim.task_id,
                        attempt_id=claim.attempt_id,
                    )
                else:
                    # Written before the request, so that a kill during it leaves an indeterminate commit in the
                    # history (the test kills a worker exactly then); the checker counts only answers.
                    record(
                        "commit",
                        started,
                        status=-1,
                        outcome="SENT",
                        task_id=claim.task_id,
                        attempt_id=claim.attempt_id,
                    )
                    committed = cp.commit(claim, result)
                    record(
                        "commit",
                        started,
                        status=200,
                        outcome="COMMITTED",
                        task_id=claim.task_id,
                        attempt_id=claim.attempt_id,
                        generation=claim.claim_generation,
                        epoch=claim.scheduler_epoch,
                        commit_id=committed.result_commit_id,
                    )
            except sdk.ClaimError as exc:
                record(
                    op,
                    started,
                    status=exc.status,
                    outcome=exc.outcome,
                    reason=exc.reason,
                    task_id=claim.task_id,
                    attempt_id=claim.attempt_id,
                    generation=claim.claim_generation,
                )
                break
            except httpx.HTTPError as exc:
                record(
                    op,
                    started,
                    status=0,
                    outcome="ERROR",
                    detail=type(exc).__name__,
                    task_id=claim.task_id,
                    attempt_id=claim.attempt_id,
                    generation=claim.claim_generation,
                )
                break


def granted(claim) -> dict:
    """A grant as the history records it: what the checker compares with the rows."""
    return {
        "status": 200,
        "outcome": "CLAIMED",
        "task_id": claim.task_id,
        "attempt_id": claim.attempt_id,
        "generation": claim.claim_generation,
        "epoch": claim.scheduler_epoch,
        "input_digest": claim.input_digest,
    }


def claim_batch_of(cp, epoch: int, namespace: str) -> tuple[float, list]:
    started = time.time()
    return started, cp.claim_batch(
        max_tasks=3, scheduler_epoch=epoch, ttl_seconds=2, namespace=namespace, wait_seconds=1
    )


def batch(cp, claimed: tuple[float, list], effects: httpx.Client, target: str, record) -> None:
    """A batch claim's tasks: each recorded as a grant, renewed once, its effect made where it has one, then all
    committed in one batch commit (each item answered on its own)."""
    started, claims = claimed
    for claim in claims:
        record("claim", started, **granted(claim), batch=True)
    ready = []
    for claim in claims:
        started = time.time()
        ids = {"task_id": claim.task_id, "attempt_id": claim.attempt_id, "generation": claim.claim_generation}
        try:
            cp.renew(claim, extend_seconds=2)
            record("renew", started, status=200, outcome="RENEWED", **ids)
        except sdk.ClaimError as exc:
            record("renew", started, status=exc.status, outcome=exc.outcome, reason=exc.reason, **ids)
            continue
        except httpx.HTTPError as exc:
            record("renew", started, status=0, outcome="ERROR", detail=type(exc).__name__, **ids)
            continue
        kind = (claim.input or {}).get("kind", "plain") if isinstance(claim.input, dict) else "plain"
        if (
            target
            and kind in ("effect", "dispatch")
            and not side_effect(cp, effects, claim, kind, target, record)
        ):
            continue
        ready.append(claim)
    if not ready:
        return
    started = time.time()
    results = [
        {"computed_on": c.input_digest, "by": cp.owner_id, "generation": c.claim_generation} for c in ready
    ]
    for claim in ready:  # written before the request: a commit whose answer is lost stays indeterminate
        record(
            "commit", started, status=-1, outcome="SENT", task_id=claim.task_id, attempt_id=claim.attempt_id
        )
    try:
        answers = cp.commit_many(list(zip(ready, results, strict=True)))
    except (sdk.ClaimError, httpx.HTTPError) as exc:
        for claim in ready:
            record(
                "commit",
                started,
                status=getattr(exc, "status", 0),
                outcome="ERROR",
                task_id=claim.task_id,
                attempt_id=claim.attempt_id,
                generation=claim.claim_generation,
            )
        return
    for claim, answer in zip(ready, answers, strict=True):
        ids = {"task_id": claim.task_id, "attempt_id": claim.attempt_id, "generation": claim.claim_generation}
        if isinstance(answer, sdk.ClaimError):
            record(
                "commit", started, status=answer.status, outcome=answer.outcome, reason=answer.reason, **ids
            )
        else:
            record(
                "commit",
                started,
                status=200,
                outcome="COMMITTED",
                epoch=claim.scheduler_epoch,
                commit_id=answer.result_commit_id,
                batch=True,
                **ids,
            )


def side_effect(cp, effects: httpx.Client, claim, kind: str, target: str, record) -> bool:
    """The task's one external side effect, at most once across attempts: directly through the SDK (prepare →
    call with the key and the claim generation as fencing token → outcome; reconcile by asking the target after
    a lost reply), or through the dispatch gateway (the control plane's Celery worker delivers it). True when the
    worker may go on to commit."""
    payload = {"task": claim.task_id, "amount": 10}
    started = time.time()
    ids = {"task_id": claim.task_id, "attempt_id": claim.attempt_id, "generation": claim.claim_generation}

    def call(key: str):
        reply = effects.post(
            f"{target}/charge",
            json=payload,
            headers={"Idempotency-Key": key, "X-Claim-Generation": str(claim.claim_generation)},
        )
        reply.raise_for_status()  # a 409 from the target's fence is not a definite failure of the effect
        return reply.json()

    def check(key: str) -> bool:
        return bool(effects.get(f"{target}/calls/{key}").json()["occurred"])

    try:
        if kind == "effect":
            done = cp.effect(claim, "charge", payload, call=call, check=check)
            record(
                "effect",
                started,
                status=200,
                outcome=done.state,
                effect_id=done.effect_id,
                called=done.called,
                **ids,
            )
        else:
            ticket = cp.prepare(claim, "notify", payload)
            if ticket.outcome == "PREPARED":
                record("dispatch", started, status=-1, outcome="SENT", effect_id=ticket.effect_id, **ids)
                cp.dispatch(claim, ticket.effect_id, payload, target=f"{target}/notify")
            record("dispatch", started, status=200, outcome=ticket.outcome, effect_id=ticket.effect_id, **ids)
        return True
    except sdk.EffectUnknown as exc:
        record("effect", started, status=0, outcome="UNKNOWN", effect_id=exc.effect_id, **ids)
        try:
            cp.release(claim)  # let another attempt reconcile it (it must ask the target, not call again)
        except (sdk.ClaimError, httpx.HTTPError):
            pass
    except sdk.ClaimError as exc:
        record(kind, started, status=exc.status, outcome=exc.outcome, reason=exc.reason, **ids)
    except httpx.HTTPError as exc:
        record(kind, started, status=0, outcome="ERROR", detail=type(exc).__name__, **ids)
    return False


def tool_call(url: str, token: str, claim, record) -> bool:
    """The task's side effect as an agent makes it: an MCP tool call through the control plane's gateway
    (docs/mcp.md), ``rec__create_record`` of the counting downstream (tests/gateway/counting_server.py), on the
    claim's own endpoint. Recorded as ``mcp``: 200 when the tool answered, the refusal's outcome when the gateway
    refused, ERROR when the call got no answer (the checker counts only answers). True when the worker may commit."""
    from tests.gateway.support import call, outcome

    started = time.time()
    ids = {"task_id": claim.task_id, "attempt_id": claim.attempt_id, "generation": claim.claim_generation}
    try:
        result = call(url, token, claim.attempt_id, "rec__create_record", {"name": claim.task_id}, timeout=10)
    except Exception as exc:  # noqa: BLE001 - a connection lost mid-call (a failover) surfaces in many types
        record("mcp", started, status=0, outcome="ERROR", detail=type(exc).__name__, **ids)
        return False
    if result.is_error:
        record("mcp", started, status=409, outcome=outcome(result) or "TOOL_ERROR", **ids)
        return False
    record("mcp", started, status=200, outcome="COMMITTED", **ids)
    return True


if __name__ == "__main__":
    main(*sys.argv[1:6], float(sys.argv[6]), *sys.argv[7:8])
