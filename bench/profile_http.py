"""Where a worker request's time goes: N claim-next → commit cycles through the whole Django stack in-process
(middleware, DRF, authentication, routing, the service, rendering — no network, no server), on PostgreSQL.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/controlplane_bench .venv/bin/python bench/profile_http.py

Prints, per operation, the wall time per request, the part spent waiting on PostgreSQL (every statement timed
by a connection execute wrapper), the statements per request, and then the cProfile top functions by own time
(--top). ``--inline`` commits with the result inline (two requests a cycle); without it the cycle stages first.
``--batch N`` claims N in one request and commits them in one (``POST /commits``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")


class DbTimer:
    def __init__(self) -> None:
        self.seconds = 0.0
        self.statements = 0

    def __call__(self, execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.seconds += time.perf_counter() - started
            self.statements += 1


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cycles", type=int, default=300)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--sort", default="tottime", help="pstats order: tottime, cumulative")
    parser.add_argument("--warm", type=int, default=10, help="cycles run first and not counted")
    parser.add_argument(
        "--no-migrate", action="store_true", help="measure the schema as it is (an A/B of two migrations)"
    )
    parser.add_argument("--dump", help="also write the raw profile here (for pstats' callers and callees)")
    parser.add_argument("--inline", action="store_true", help="commit with the result inline (claim.v1 §9)")
    parser.add_argument(
        "--batch", type=int, default=0, help="claim N in one request and commit them in one (claim.v1 §9)"
    )
    args = parser.parse_args()
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    from bench.claims import seed
    from claims.digest import digest
    from claims.services import token_issue

    if not args.no_migrate:
        call_command("migrate", verbosity=0)
    namespace = f"bench-prof-{int(time.time())}"
    seed(namespace, (2 * args.cycles + 20) * max(args.batch, 1))
    issued = token_issue(name=f"prof-{namespace}", role="worker", pool="v1")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {issued.token}", HTTP_HOST="127.0.0.1")
    owner = issued.principal.name

    def post(path: str, body: dict):
        return client.post(f"/api/v1{path}", json.dumps(body), content_type="application/json")

    timers: dict[str, DbTimer] = defaultdict(DbTimer)
    walls: dict[str, float] = defaultdict(float)

    def timed(op: str, path: str, body: dict):
        timer = timers[op]
        started = time.perf_counter()
        with connection.execute_wrapper(timer):
            response = post(path, body)
        walls[op] += time.perf_counter() - started
        assert response.status_code in (200, 201), (op, response.status_code, response.content)
        return response.json()

    def batch_cycle() -> None:
        claims = timed(
            "claims/batch",
            "/claims/batch",
            {
                "owner_id": owner,
                "scheduler_epoch": 1,
                "ttl_seconds": 300,
                "namespace": namespace,
                "max_tasks": args.batch,
            },
        )["claims"]
        items = [
            {
                "task_id": c["task_id"],
                "attempt_id": c["attempt_id"],
                "scheduler_epoch": c["scheduler_epoch"],
                "claim_generation": c["claim_generation"],
                "observed_cancel_generation": c["cancel_generation"],
                "input_digest": c["input_digest"],
                "result": {"task": c["task_id"]},
                "result_digest": digest({"task": c["task_id"]}),
            }
            for c in claims
        ]
        answers = timed("commits", "/commits", {"commits": items})["results"]
        assert all(a["status"] == 200 for a in answers), answers

    def single_cycle() -> None:
        claim = timed(
            "claim-next",
            "/claims",
            {"owner_id": owner, "scheduler_epoch": 1, "ttl_seconds": 300, "namespace": namespace},
        )
        result = {"task": claim["task_id"]}
        fence = {
            "attempt_id": claim["attempt_id"],
            "scheduler_epoch": claim["scheduler_epoch"],
            "claim_generation": claim["claim_generation"],
        }
        if not args.inline:
            timed(
                "stage",
                f"/tasks/{claim['task_id']}/results",
                {
                    "attempt_id": claim["attempt_id"],
                    "claim_generation": claim["claim_generation"],
                    "result": result,
                    "result_digest": digest(result),
                },
            )
        body = {
            **fence,
            "observed_cancel_generation": claim["cancel_generation"],
            "input_digest": claim["input_digest"],
            "result_digest": digest(result),
        }
        if args.inline:
            body["result"] = result
        timed("commit", f"/tasks/{claim['task_id']}/commit", body)

    cycle = batch_cycle if args.batch else single_cycle
    for _ in range(args.warm):  # warm up: imports, caches, the first connection
        cycle()
    timers.clear()
    walls.clear()
    for _ in range(args.cycles):
        cycle()
    print(
        f"{args.cycles} cycles, {f'batches of {args.batch}' if args.batch else 'inline commit' if args.inline else 'stage + commit'}, no profiler"
    )
    print("| request | wall ms | in PostgreSQL ms | outside ms | statements |")
    print("|---|---:|---:|---:|---:|")
    for op, wall in walls.items():
        t = timers[op]
        n = args.cycles
        print(
            f"| {op} | {wall / n * 1000:.2f} | {t.seconds / n * 1000:.2f} | {(wall - t.seconds) / n * 1000:.2f} | {t.statements / n:.1f} |"
        )
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(args.cycles):
        cycle()
    profiler.disable()
    if args.dump:
        profiler.dump_stats(args.dump)
    print(f"\nthen {args.cycles} cycles under cProfile, by own time:")
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats(args.sort).print_stats(args.top)
    print(out.getvalue())


if __name__ == "__main__":
    main()
