"""A chaos worker process: claim-next, think, stage, commit — recording every request and answer with
timestamps (JSON lines) for the history checker. It survives what a real worker survives: lost connections,
5xx, fences, pauses."""

from __future__ import annotations

import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx  # noqa: E402

from claims import client as sdk  # noqa: E402


def main(url: str, token: str, owner: str, namespace: str, log_path: str, seconds: float) -> None:
    rng = random.Random(owner)
    log = open(log_path, "a", buffering=1)
    cp = sdk.ControlPlane(url, token, owner_id=owner, timeout=5)

    def record(op: str, started: float, **fields) -> None:
        log.write(json.dumps({"op": op, "owner": owner, "t0": started, "t1": time.time(), **fields}) + "\n")

    deadline = time.time() + seconds
    epoch = 1
    while time.time() < deadline:
        started = time.time()
        try:
            claim = cp.claim_next(scheduler_epoch=epoch, ttl_seconds=2, namespace=namespace)
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
        record(
            "claim",
            started,
            status=200,
            outcome="CLAIMED",
            task_id=claim.task_id,
            attempt_id=claim.attempt_id,
            generation=claim.claim_generation,
            epoch=claim.scheduler_epoch,
            input_digest=claim.input_digest,
        )
        time.sleep(rng.uniform(0, 0.4))  # think (a SIGSTOP can land here and outlast the lease)
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


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], float(sys.argv[6]))
