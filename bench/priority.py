"""Benchmark for claim-v1.md §10 (priority and fair share), each comparison in one run on one PostgreSQL database:

1. **speed**: W worker processes loop through claims.services — claim-next → commit with the result inline, and
   batch claims of 10 → one batch commit — on tasks created with none of §10 (one key, one priority: the oldest-first
   path) and on tasks with priorities 1–5 and ten fairness keys of weights 1–10. Measured A-B-B-A per round (a
   machine drifting during the comparison weighs on both sides alike); the ratio mixed ÷ oldest-first per round.
2. **flat cost**: one worker's claim-next (and release) latency with 10,000, 100,000 and 1,000,000 READY tasks
   waiting, with priorities and ten keys; p50 and p99, and the ratio 1,000,000 ÷ 10,000; the pick's plan at the
   largest size (EXPLAIN ANALYZE, BUFFERS).
3. **the fleet**: the server over HTTP (gunicorn, 2 processes) and W worker processes claiming in batches through
   the SDK. 100,000 tasks of key "big" (weight 3) wait; as the workers start, 100 tasks of key "small" (weight 1)
   are created through the API. Each second's grants by key, and the small tasks' wait (created → granted, the
   rows' own clocks): p50 and p99.

    createdb controlplane_bench
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/controlplane_bench python bench/priority.py

Writes bench/results/priority-<timestamp>.json and prints the tables recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

from bench.claims import _setup_django, percentile  # noqa: E402

KEYS = [(f"tenant-{k}", float(k + 1)) for k in range(10)]  # ten keys, weights 1..10
INPUT = {"bench": True}


def seed(namespace: str, count: int, *, mixed: bool) -> None:
    """A fresh namespace with ``count`` READY tasks: one lane (none of §10), or priorities 1–5 × ten keys. Each lane is
    stamped by the product (``fair_share.stamp``, the whole lane at once, as a create stamps one); the rows are
    written by SQL."""
    from django.db import connection, transaction
    from django.utils import timezone

    from claims.digest import digest
    from claims.models import Namespace
    from claims.services import fair_share
    from claims.services._base import hold_namespace

    now = timezone.now()
    Namespace.objects.get_or_create(name=namespace, defaults={"created_at": now, "updated_at": now})
    lanes = [(p, key, w) for p in range(1, 6) for key, w in KEYS] if mixed else [(3, "", None)]
    per_lane = count // len(lanes)
    with transaction.atomic(), connection.cursor() as cursor:
        ns = hold_namespace(name=namespace)
        placed = []  # each lane: its priority, key, weight and first place, one stride apart (stamp's arithmetic)
        for priority, key, weight in lanes:
            places = fair_share.stamp(ns, priority=priority, key=key, weight=weight, count=per_lane)
            placed.append((priority, key, places.weight, places.vtags[0]))
        # The rows in the order a real queue receives them, the lanes interleaved by place (so that a page of the
        # table holds tasks of every key, as when tenants' tasks arrive over time), not one lane after another.
        cursor.execute(
            "INSERT INTO claims_task (task_id, namespace_id, node_id, input, input_digest, depends_on, "
            "replay_policy, resources, has_successors, has_resources, state, state_version, scheduler_epoch, "
            "claim_generation, cancel_generation, priority, fairness_key, fairness_weight, vtag, created_at, "
            "updated_at) "
            "SELECT %s || '-' || l.n || '-' || g, %s, 'bench', %s::jsonb, %s, '[]'::jsonb, 'REPLAYABLE', "
            "'[]'::jsonb, false, false, 'READY', 1, 0, 0, 0, l.priority, l.key, l.weight, l.first + (g - 1) / l.weight, "
            "now() + g * interval '1 microsecond', now() "
            "FROM unnest(%s::int[], %s::text[], %s::float8[], %s::float8[]) WITH ORDINALITY "
            "AS l(priority, key, weight, first, n), generate_series(1, %s) AS g ORDER BY l.first + (g - 1) / l.weight",
            [namespace, ns.id, json.dumps(INPUT), digest(INPUT), *map(list, zip(*placed, strict=True)), per_lane],
        )  # fmt: skip
        cursor.execute("ANALYZE claims_task")  # as autovacuum would after a bulk load


def _cycles(index: int, namespace: str, seconds: float, batch: int, queue: mp.Queue) -> None:
    _setup_django()
    from claims import services
    from claims.digest import digest
    from claims.services import token_issue

    principal = token_issue(name=f"bench-{namespace}-{index}", role="worker", pool="v1").principal
    done, deadline = 0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        grants = services.task_claim_batch(
            principal=principal,
            owner_id=principal.name,
            scheduler_epoch=1,
            ttl_seconds=300,
            max_tasks=batch,
            namespace=namespace,
        )
        if not grants:
            break
        items = []
        for grant in grants:
            task, result = grant.task, {"task": grant.task.task_id}
            fields = {
                "attempt_id": grant.attempt_id,
                "scheduler_epoch": 1,
                "claim_generation": task.claim_generation,
                "observed_cancel_generation": task.cancel_generation,
                "input_digest": task.input_digest,
                "result_digest": digest(result),
                "result": result,
            }
            items.append((task.task_id, fields))
        if batch == 1:
            services.task_commit(principal=principal, task_id=items[0][0], **items[0][1])
        else:  # the API's batch commit: the common items decided together (every bench task is one)
            decided = services.task_commit_many(principal=principal, items=items)
            assert len(decided) == len(items), decided
        done += len(grants)
    queue.put(done)


def measure(namespace: str, workers: int, seconds: float, batch: int) -> float:
    """Tasks claimed and committed per second by ``workers`` processes."""
    from django.db import connections

    connections.close_all()  # never share a connection across fork
    ctx = mp.get_context("fork")
    queue: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=_cycles, args=(i, namespace, seconds, batch, queue)) for i in range(workers)]
    for proc in procs:
        proc.start()
    done = sum(queue.get(timeout=seconds + 120) for _ in procs)
    for proc in procs:
        proc.join(30)
    return done / seconds


def speed(workers: int, seconds: float, tasks: int, rounds: int) -> dict[str, Any]:
    out: dict[str, Any] = {"workers": workers, "seconds": seconds, "rounds": []}
    for r in range(rounds):
        row: dict[str, Any] = {}
        for label, batch in (("claim_next", 1), ("batch10", 10)):
            rates: dict[str, list[float]] = {"oldest_first": [], "mixed": []}
            for i, kind in enumerate(("oldest_first", "mixed", "mixed", "oldest_first")):
                namespace = f"bench-pri-{label}-{kind}-{r}-{i}-{int(time.time())}"
                seed(namespace, tasks * batch, mixed=kind == "mixed")
                rates[kind].append(measure(namespace, workers, seconds / 2, batch))
            row[label] = {kind: sum(v) / len(v) for kind, v in rates.items()}
            row[label]["ratio"] = row[label]["mixed"] / row[label]["oldest_first"]
        print(json.dumps(row), flush=True)
        out["rounds"].append(row)
    return out


def flat_cost(sizes: list[int], claims: int) -> dict[str, Any]:
    from django.db import connection

    from claims import services
    from claims.services import token_issue

    rows = {}
    for size in sizes:
        namespace = f"bench-flat-{size}-{int(time.time())}"
        seed(namespace, size, mixed=True)
        principal = token_issue(name=f"bench-flat-{size}", role="worker", pool="v1").principal
        latencies = []
        for _ in range(claims):
            started = time.perf_counter()
            grant = services.task_claim_next(
                principal=principal,
                owner_id=principal.name,
                scheduler_epoch=1,
                ttl_seconds=300,
                namespace=namespace,
            )
            latencies.append(time.perf_counter() - started)
            assert grant is not None
        rows[size] = {
            "p50_ms": percentile(latencies, 50) * 1000,
            "p99_ms": percentile(latencies, 99) * 1000,
            **_scrape(namespace),
        }
        print(json.dumps({size: rows[size]}), flush=True)
        if size == max(sizes):
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT id, scheduler_epoch FROM claims_namespace WHERE name = %s", [namespace]
                )
                ns_id, epoch = cursor.fetchone()
                cursor.execute(
                    "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) SELECT c.task_id FROM claims_task c "
                    "WHERE c.namespace_id = %s AND c.state = 'READY' AND c.priority <= COALESCE((SELECT s.priority "
                    "FROM claims_task s WHERE s.namespace_id = %s AND s.state = 'CLAIMED' AND (s.lease_expires_at "
                    "<= now() OR s.scheduler_epoch < %s) ORDER BY s.priority LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED), "
                    "32767) ORDER BY c.priority, c.vtag, c.task_id LIMIT 1 FOR NO KEY UPDATE SKIP LOCKED",
                    [ns_id, ns_id, epoch],
                )
                rows["plan"] = [line for (line,) in cursor.fetchall()]
    rows["ratio_largest_to_smallest"] = rows[max(sizes)]["p50_ms"] / rows[min(sizes)]["p50_ms"]
    rows["scrape_ratio_largest_to_smallest"] = rows[max(sizes)]["queue_ms"] / rows[min(sizes)]["queue_ms"]
    started = time.perf_counter()
    everything = _backlogs()
    rows["metrics_backlogs"] = {
        "ms": (time.perf_counter() - started) * 1000,
        "namespaces": len(everything),
        "ready_counted": sum(q.ready for q in everything.values()),
    }
    return rows


def _backlogs() -> dict[str, Any]:
    from claims import queues

    return queues.backlogs()


def _scrape(namespace: str) -> dict[str, float]:
    """What the namespace page and /metrics read for one namespace (claims.queues: counts up to the cap, keys from
    their lanes), against the exact grouped counts they replaced — median of 5 each."""
    from django.db.models import Count
    from django.utils import timezone

    from claims import queues
    from claims.models import Namespace, Task

    ns = Namespace.objects.get(name=namespace)
    ready = Task.objects.filter(namespace=ns, state="READY")

    def exact() -> None:
        list(ready.values_list("priority").annotate(n=Count("*")))
        list(ready.values_list("fairness_key").annotate(n=Count("*")))

    def timed(fn: Any) -> float:
        runs = []
        for _ in range(5):
            started = time.perf_counter()
            fn()
            runs.append((time.perf_counter() - started) * 1000)
        return sorted(runs)[2]

    return {"queue_ms": timed(lambda: queues.queue(ns, timezone.now())), "exact_counts_ms": timed(exact)}


def fleet(workers: int, seconds: float, port: int) -> dict[str, Any]:
    """Real HTTP: 100,000 of weight 3 waiting, 100 of weight 1 created as the workers start (see the docstring)."""
    import httpx
    from django.db import connection

    from bench.sidebyside import start_server, stop_server, tokens
    from claims.models import Task
    from claims.services import token_issue

    namespace = f"bench-fleet-{int(time.time())}"
    seed_fleet(namespace)
    url = f"http://127.0.0.1:{port}"
    server = start_server(port, 2)
    try:
        operator = token_issue(name="bench-fleet-op", role="operator").token
        client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {operator}"}, timeout=30)
        for n in range(100):  # created through the API after the large backlog, before the fleet starts
            answer = client.post(
                "/api/v1/tasks",
                json={"task_id": f"{namespace}-small-{n:03d}", "namespace": namespace, "node_id": "bench",
                      "input": {"n": n}, "fairness_key": "small", "fairness_weight": 1},
            )  # fmt: skip
            assert answer.status_code == 201, answer.text
        ctx = mp.get_context("spawn")
        procs = [
            ctx.Process(target=_fleet_worker, args=(url, token, name, namespace, seconds))
            for name, token in tokens("bench-fleet-w", workers)
        ]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(seconds + 60)
    finally:
        stop_server(server)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT t.fairness_key, a.started_at, t.created_at FROM claims_attempt a JOIN claims_task t "
            "ON t.task_id = a.task_id WHERE a.namespace_id = (SELECT id FROM claims_namespace WHERE name = %s) "
            "ORDER BY a.started_at",
            [namespace],
        )
        grants = cursor.fetchall()
    first = grants[0][1]  # the fleet's first grant
    per_second: dict[int, dict[str, int]] = {}
    waits, since_start = [], []
    for key, at, created in grants:
        second = int((at - first).total_seconds())
        per_second.setdefault(second, {"big": 0, "small": 0})[key] += 1
        if key == "small":
            waits.append((at - created).total_seconds())
            since_start.append((at - first).total_seconds())
    opening = [key for key, _, _ in grants[:400]]
    left = Task.objects.filter(namespace__name=namespace, fairness_key="small", state="READY").count()
    return {
        "workers": workers,
        "per_second": {s: v for s, v in sorted(per_second.items()) if s >= 0},
        "small_granted": len(waits),
        "small_left": left,
        "small_share_of_first_400_grants": opening.count("small") / max(1, len(opening)),
        "small_wait_p50_s": percentile(waits, 50),  # created → granted (created before the fleet started)
        "small_wait_p99_s": percentile(waits, 99),
        "small_granted_after_start_p50_s": percentile(since_start, 50),
        "small_granted_after_start_p99_s": percentile(since_start, 99),
    }


def seed_fleet(namespace: str) -> None:
    from django.db import connection, transaction
    from django.utils import timezone

    from claims.digest import digest
    from claims.models import Namespace
    from claims.services import fair_share
    from claims.services._base import hold_namespace

    now = timezone.now()
    Namespace.objects.get_or_create(name=namespace, defaults={"created_at": now, "updated_at": now})
    with transaction.atomic(), connection.cursor() as cursor:
        ns = hold_namespace(name=namespace)
        places = fair_share.stamp(ns, priority=3, key="big", weight=3, count=100_000)
        cursor.execute(
            "INSERT INTO claims_task (task_id, namespace_id, node_id, input, input_digest, depends_on, replay_policy, "
            "resources, has_successors, has_resources, state, state_version, scheduler_epoch, claim_generation, "
            "cancel_generation, priority, fairness_key, fairness_weight, vtag, created_at, updated_at) "
            "SELECT %s || '-big-' || g, %s, 'bench', %s::jsonb, %s, '[]'::jsonb, 'REPLAYABLE', '[]'::jsonb, false, "
            "false, 'READY', 1, 0, 0, 0, 3, 'big', 3, %s + (g - 1) / 3.0, now(), now() "
            "FROM generate_series(1, 100000) AS g",
            [namespace, ns.id, json.dumps(INPUT), digest(INPUT), places.vtags[0]],
        )
        cursor.execute("ANALYZE claims_task")


def _fleet_worker(url: str, token: str, owner: str, namespace: str, seconds: float) -> None:
    import claim_client as sdk

    cp = sdk.ControlPlane(url, token, owner_id=owner, timeout=30)
    deadline = time.time() + seconds
    while time.time() < deadline:
        claims = cp.claim_batch(max_tasks=10, scheduler_epoch=1, ttl_seconds=60, namespace=namespace)
        if claims:
            cp.commit_many([(claim, {"by": owner}) for claim in claims])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--tasks", type=int, default=6000, help="tasks seeded per measurement (× the batch)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="10000,100000,1000000")
    parser.add_argument("--claims", type=int, default=400, help="claim-next calls per size")
    parser.add_argument("--port", type=int, default=8112)
    parser.add_argument("--parts", default="speed,flat,fleet")
    args = parser.parse_args()
    _setup_django()
    parts = args.parts.split(",")
    result: dict[str, Any] = {"when": datetime.now(UTC).isoformat(), "cpus": os.cpu_count()}
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    path = ROOT / "bench" / "results" / f"priority-{stamp}.json"
    for part, run in (
        ("speed", lambda: speed(args.workers, args.seconds, args.tasks, args.rounds)),
        ("flat", lambda: flat_cost([int(s) for s in args.sizes.split(",")], args.claims)),
        ("fleet", lambda: fleet(args.workers, args.seconds * 2, args.port)),
    ):
        if part in parts:
            result[part] = run()
            path.write_text(json.dumps(result, indent=2, default=str))  # each part kept as it is done
    print(json.dumps({k: v for k, v in result.items() if k != "flat"}, indent=2, default=str))
    print(f"written {path}")


if __name__ == "__main__":
    main()
