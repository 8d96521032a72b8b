"""An example claim.v1 worker: claim, compute, one side effect at most once, stage, commit.

Run a control plane (`make run`), make a worker token and a task, then:

    TOKEN=$(.venv/bin/python manage.py issue_token --role worker --name worker-a 2>/dev/null | tail -1)
    .venv/bin/python docs/example_worker.py --url http://127.0.0.1:8000 --token "$TOKEN" --owner worker-a --once

The side effect here is a POST to a webhook (``--webhook``); the worker sends the effect's idempotency key so
the receiver can deduplicate, and asks the receiver (``GET <webhook>/calls/<key>``) whether a key was applied
when an earlier attempt's outcome is unknown. Without ``--webhook`` the effect is a local print.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx

# The worker SDK from this checkout (clients/python), so that the example runs with what `make run` installs —
# or with the server's package alone — as well as where the SDK is installed (pip install ./clients/python).
sys.path.append(str(Path(__file__).resolve().parent.parent / "clients" / "python"))

import claim_client as sdk  # noqa: E402


def work_once(
    cp: sdk.ControlPlane, *, webhook: str | None, namespace: str = "default", ttl: int = 30
) -> str | None:
    """Claim the next task and finish it. Returns the task id, or None when nothing was claimable."""
    epoch = cp.namespace(namespace)["scheduler_epoch"]
    claim = cp.claim_next(scheduler_epoch=epoch, ttl_seconds=ttl, namespace=namespace)
    if claim is None:
        return None
    with cp.lease(claim) as lease:
        result = {"summary": str(claim.input).upper()}  # the "work"
        lease.check()  # fenced or cancelled meanwhile? stop before the side effect

        def call(key: str):
            if webhook is None:
                print(f"[effect] notify {claim.task_id} (key {key[:12]}…)")
                return "printed"
            reply = httpx.post(webhook, json=result, headers={"Idempotency-Key": key}, timeout=5)
            reply.raise_for_status()
            return reply.status_code

        def check(key: str) -> bool:
            return bool(webhook) and httpx.get(f"{webhook}/calls/{key}", timeout=5).json().get(
                "occurred", False
            )

        if lease.remaining() < 5:
            raise RuntimeError("not enough lease left for the side effect; let it expire and be reclaimed")
        cp.effect(claim, "notify", result, call=call, check=check)
        cp.stage(claim, result)
        cp.commit(claim, result)
    return claim.task_id


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--token", required=True)
    parser.add_argument("--owner", required=True, help="the worker token's name (its owner_id)")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--webhook", default=None)
    parser.add_argument("--once", action="store_true", help="finish at most one task, then exit")
    args = parser.parse_args(argv)
    with sdk.ControlPlane(args.url, args.token, owner_id=args.owner) as cp:
        while True:
            try:
                task_id = work_once(cp, webhook=args.webhook, namespace=args.namespace)
            except (sdk.Fenced, sdk.Cancelled, sdk.Expired, sdk.StaleInput) as lost:
                print(f"gave the task up: {lost.outcome} ({lost.reason})")  # somebody else owns it now
                task_id = "lost"
            if task_id:
                print(f"finished {task_id}")
            if args.once:
                return 0
            if task_id is None:
                time.sleep(1)


if __name__ == "__main__":
    raise SystemExit(main())
