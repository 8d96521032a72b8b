"""Benchmark (issue 21): what waiting claims cost when they have nothing to take, and how soon a heterogeneous fleet
of waiters is handed what becomes claimable. One run, one PostgreSQL database, the production server (gunicorn with
uvicorn workers, deploy/gunicorn.conf.py, pooled connections):

1. **Idle cost.** W waiters filtered to a node nothing is ever created for, in a namespace with one expired,
   unreclaimed lease of another node (the condition that once made them re-poll every 50 ms) and a steady stream of
   notifications for other nodes (a task of another node created every 100 ms). Transactions per waiter-second =
   (the database's committed + rolled-back transactions during the phase − the same phase's count without the
   waiters) ÷ (W × seconds). The goal: at most 2.
2. **Wake latency**, from the rows' own database timestamps. Waiters of three nodes (two each), two batch waiters
   of any node, and three clients that start a waiting claim and hang up on it; an operator creates tasks of random
   nodes, a fifth of them listing one shared resource key; every waiter commits what it is granted at once (result
   inline) and waits again. Latency of a task = its first grant (its first attempt's start, to any waiter) − when
   it became claimable: its creation, or, for a key task, the end of the key's previous holding attempt, whichever
   is later. The goal: p99 under 100 ms. Grants the server released because their client had gone are counted; an
   answer a client dropped as it hung up (sent before the server could know) holds its task and key for its 2 s
   lease (the contract's bound): the key is free for the next task from that expiry. The same latency as the
   clients saw it (creation answered → grant answered) is given for the tasks without the key.

    createdb controlplane_bench
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/controlplane_bench .venv/bin/python bench/waiters.py

Writes bench/results/waiters-<timestamp>.json and prints the figures recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def transactions() -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
        )
        return cursor.fetchone()[0]


def stats_settled() -> None:
    """pg_stat_database is updated by each backend at most every PGSTAT_MIN_INTERVAL (1 s) and when idle."""
    time.sleep(1.5)


def namespace(name: str) -> None:
    from claims.models import Namespace

    now = datetime.now(UTC)
    Namespace.objects.get_or_create(name=name, defaults={"created_at": now, "updated_at": now})


def token(name: str, role: str) -> str:
    from claims.services import token_issue

    return token_issue(name=name, role=role, pool="v1").token


def idle_cost(url: str, waiters: int, seconds: float) -> dict[str, Any]:
    import httpx

    ns = f"idle-{int(time.time())}"
    namespace(ns)
    operator, holder = token(f"{ns}-op", "operator"), token(f"{ns}-holder", "worker")
    waiter_tokens = [(f"{ns}-w{i}", token(f"{ns}-w{i}", "worker")) for i in range(waiters)]
    http = httpx.Client(base_url=url, timeout=60)
    h = {"Authorization": f"Bearer {operator}"}
    http.post("/api/v1/tasks", json={"namespace": ns, "node_id": "other", "input": {}}, headers=h)
    body = {"owner_id": f"{ns}-holder", "scheduler_epoch": 1, "ttl_seconds": 1, "namespace": ns}
    assert (
        http.post("/api/v1/claims", json=body, headers={"Authorization": f"Bearer {holder}"}).status_code
        == 200
    )
    time.sleep(1.2)  # its lease runs out; nobody of its node comes to reclaim it

    async def notifications(stop: float) -> int:
        created = 0
        async with httpx.AsyncClient(base_url=url, timeout=30, headers=h) as client:
            while time.monotonic() < stop:
                await client.post("/api/v1/tasks", json={"namespace": ns, "node_id": "busy", "input": {}})
                created += 1
                await asyncio.sleep(0.1)
        return created

    async def wait(owner: str, tok: str) -> int:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            answer = await client.post(
                "/api/v1/claims",
                json={
                    "owner_id": owner,
                    "scheduler_epoch": 1,
                    "ttl_seconds": 30,
                    "namespace": ns,
                    "node_ids": ["idle"],
                    "wait_seconds": int(seconds),
                },
                headers={"Authorization": f"Bearer {tok}"},
            )
            return answer.status_code

    async def phase(with_waiters: bool) -> tuple[int, int, list[int]]:
        stats_settled()
        before = await asyncio.to_thread(transactions)
        stop = time.monotonic() + seconds
        jobs = [wait(o, t) for o, t in waiter_tokens] if with_waiters else []
        created, *answers = await asyncio.gather(notifications(stop), *jobs)
        stats_settled()
        after = await asyncio.to_thread(transactions)
        return after - before, created, list(answers)

    baseline, base_created, _ = asyncio.run(phase(False))
    loaded, loaded_created, answers = asyncio.run(phase(True))
    # The two phases create about as many tasks; scale the baseline to the loaded phase's creations.
    extra = loaded - baseline * (loaded_created / max(1, base_created))
    return {
        "waiters": waiters,
        "seconds": seconds,
        "baseline_transactions": baseline,
        "baseline_creates": base_created,
        "with_waiters_transactions": loaded,
        "with_waiters_creates": loaded_created,
        "answers": {str(code): answers.count(code) for code in set(answers)},
        "transactions_per_waiter_second": extra / (waiters * seconds),
    }


def wake_latency(url: str, seconds: float, rate: float, seed: int = 21) -> dict[str, Any]:
    import httpx

    from claims.digest import digest
    from claims.models import Attempt, Task
    from claims.services import resource_create

    ns = f"wake-{int(time.time())}"
    namespace(ns)
    key = f"{ns}-key"
    from claims.models import Principal

    operator = token(f"{ns}-op", "operator")
    resource_create(principal=Principal.objects.get(name=f"{ns}-op"), resource_key=key)
    nodes = ["x", "y", "z"]
    fleet = [(f"{ns}-{n}{i}", [n]) for n in nodes for i in range(2)] + [
        (f"{ns}-any{i}", None) for i in range(2)
    ]
    batchers = {f"{ns}-any0", f"{ns}-any1"}
    quitters = [f"{ns}-gone{i}" for i in range(3)]
    tokens = {name: token(name, "worker") for name, _ in fleet} | {q: token(q, "worker") for q in quitters}
    created: dict[str, float] = {}
    granted: dict[str, float] = {}
    key_tasks: set[str] = set()
    rng = random.Random(seed)
    resource = httpx.get(
        f"{url}/api/v1/resources/{key}", headers={"Authorization": f"Bearer {operator}"}
    ).json()

    async def commit(client: httpx.AsyncClient, owner: str, claim: dict) -> None:
        result = {"by": owner}
        body = {
            "attempt_id": claim["attempt_id"],
            "scheduler_epoch": claim["scheduler_epoch"],
            "claim_generation": claim["claim_generation"],
            "observed_cancel_generation": claim["cancel_generation"],
            "input_digest": claim["input_digest"],
            "result_digest": digest(result),
            "result": result,
        }
        if claim["fences"]:  # a key task (the producer may not have recorded it yet)
            body["resources"] = [
                {
                    "resource_key": key,
                    "incarnation": resource["incarnation"],
                    "expected_revision": revision[0],
                }
            ]
        answer = await client.post(f"/api/v1/tasks/{claim['task_id']}/commit", json=body)
        assert answer.status_code == 200, answer.text
        if claim["fences"]:
            revision[0] += 1

    revision = [resource["revision"]]

    async def waiter(owner: str, node_ids: list[str] | None, stop: float) -> None:
        batch = owner in batchers
        async with httpx.AsyncClient(
            base_url=url, timeout=60, headers={"Authorization": f"Bearer {tokens[owner]}"}
        ) as client:
            while time.time() < stop:
                body: dict[str, Any] = {
                    "owner_id": owner,
                    "scheduler_epoch": 1,
                    "ttl_seconds": 30,
                    "namespace": ns,
                    "wait_seconds": max(1, min(30, int(stop - time.time()) + 1)),
                }
                if node_ids:
                    body["node_ids"] = node_ids
                if batch:
                    body["max_tasks"] = 5
                answer = await client.post("/api/v1/claims/batch" if batch else "/api/v1/claims", json=body)
                now = time.time()
                if answer.status_code != 200:
                    continue
                claims = answer.json()["claims"] if batch else [answer.json()]
                for claim in claims:
                    granted.setdefault(claim["task_id"], now)
                for claim in claims:
                    await commit(client, owner, claim)

    received: list[str] = []  # grants a quitter did receive before it hung up (it releases them, politely)

    async def quitter(owner: str, stop: float) -> None:
        body = {
            "owner_id": owner,
            "scheduler_epoch": 1,
            "ttl_seconds": 2,  # an answer it drops holds the task for 2 s only
            "namespace": ns,
            "wait_seconds": 30,
        }
        while time.time() < stop:
            async with httpx.AsyncClient(
                base_url=url, timeout=60, headers={"Authorization": f"Bearer {tokens[owner]}"}
            ) as client:
                try:
                    answer = await asyncio.wait_for(
                        client.post("/api/v1/claims", json=body), rng.uniform(0.2, 1.5)
                    )
                except TimeoutError:
                    continue  # hung up: the connection closes with the client
            if answer.status_code == 200:
                claim = answer.json()
                received.append(claim["task_id"])
                granted.setdefault(claim["task_id"], time.time())
                async with httpx.AsyncClient(
                    base_url=url, timeout=60, headers={"Authorization": f"Bearer {tokens[owner]}"}
                ) as client:
                    await client.post(
                        f"/api/v1/tasks/{claim['task_id']}/release",
                        json={
                            "attempt_id": claim["attempt_id"],
                            "claim_generation": claim["claim_generation"],
                            "owner_id": owner,
                            "scheduler_epoch": claim["scheduler_epoch"],
                        },
                    )

    async def producer(stop: float) -> None:
        async with httpx.AsyncClient(
            base_url=url, timeout=30, headers={"Authorization": f"Bearer {operator}"}
        ) as client:
            await asyncio.sleep(1.0)  # the fleet is waiting
            while time.time() < stop:
                node = rng.choice(nodes)
                with_key = rng.random() < 0.2
                body: dict[str, Any] = {"namespace": ns, "node_id": node, "input": {"n": rng.random()}}
                if with_key:
                    body["resources"] = [key]
                answer = await client.post("/api/v1/tasks", json=body)
                task_id = answer.json()["task_id"]
                if with_key:
                    key_tasks.add(task_id)
                created[task_id] = time.time()
                await asyncio.sleep(rng.expovariate(rate))

    async def main() -> None:
        stop = time.time() + seconds
        await asyncio.gather(
            producer(stop),
            *[waiter(owner, node_ids, stop + 3) for owner, node_ids in fleet],
            *[quitter(q, stop) for q in quitters],
        )

    asyncio.run(main())
    # From the rows' own timestamps (the database's clock, read under the locks): a task's first grant (its first
    # attempt's start) − when it became claimable: its creation, or, for a key task, the end of the key's previous
    # holding attempt (commit, release, or — for an answer a quitter dropped as it hung up, which the server could
    # not know of — its 2 s lease running out).
    dropped = set(
        Attempt.objects.filter(namespace__name=ns, owner_id__in=quitters)
        .exclude(task_id__in=received)
        .exclude(end_reason="RELEASED")
        .values_list("attempt_id", flat=True)
    )
    created_at = dict(Task.objects.filter(namespace__name=ns).values_list("task_id", "created_at"))
    listing = set(
        Task.objects.filter(namespace__name=ns, has_resources=True).values_list("task_id", flat=True)
    )
    first: dict[str, Any] = {}
    key_free_at = None
    latencies, key_latencies = [], []
    for attempt in Attempt.objects.filter(namespace__name=ns).order_by("started_at"):
        task_id = attempt.task_id
        if task_id not in first:
            first[task_id] = attempt.started_at
            since = created_at[task_id]
            if task_id in listing and key_free_at is not None:
                since = max(since, key_free_at)
            latency = (attempt.started_at - since).total_seconds() * 1000
            latencies.append(latency)
            if task_id in listing:
                key_latencies.append(latency)
        if task_id in listing:
            end = attempt.ended_at
            if attempt.attempt_id in dropped:
                expiry = attempt.started_at + timedelta(seconds=2)
                end = min(end, expiry) if end else expiry
            key_free_at = end
    client_side = [(granted[t] - created[t]) * 1000 for t in created if t in granted and t not in key_tasks]
    left = Task.objects.filter(namespace__name=ns).exclude(state="COMMITTED").count()
    gone = Attempt.objects.filter(owner_id__in=quitters, end_reason="RELEASED").exclude(task_id__in=received)
    gone_live = Attempt.objects.filter(owner_id__in=quitters, ended_at__isnull=True).count()
    gone_granted = gone.count()
    return {
        "seconds": seconds,
        "tasks": len(created),
        "key_tasks": len(key_tasks),
        "granted": len(latencies),
        "not_committed_at_end": left,
        "grants_received_by_quitters_and_released": len(received),
        "grants_to_hung_up_clients_released_by_the_server": gone_granted,
        "answers_dropped_by_hung_up_clients": len(dropped),
        "client_side_latency_ms_tasks_without_key": {
            "p50": percentile(client_side, 50),
            "p99": percentile(client_side, 99),
            "max": max(client_side, default=float("nan")),
        },
        "hung_up_clients_live_attempts_at_end": gone_live,
        "latency_ms": {
            "p50": percentile(latencies, 50),
            "p95": percentile(latencies, 95),
            "p99": percentile(latencies, 99),
            "max": max(latencies, default=float("nan")),
        },
        "key_task_latency_ms": {
            "p50": percentile(key_latencies, 50),
            "p99": percentile(key_latencies, 99),
            "max": max(key_latencies, default=float("nan")),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--waiters", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--rate", type=float, default=10.0, help="tasks created per second in the latency phase"
    )
    parser.add_argument("--port", type=int, default=8121)
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("bench/waiters.py needs DATABASE_URL=postgres://… (a database of its own)")
    import django

    django.setup()
    from django.core.management import call_command

    from bench.sidebyside import start_server, stop_server

    call_command("migrate", verbosity=0)
    url = f"http://127.0.0.1:{args.port}"
    server = start_server(args.port, 2)
    try:
        idle = idle_cost(url, args.waiters, args.seconds)
        print(json.dumps({"idle": idle}), flush=True)
        wake = wake_latency(url, args.seconds * 2, args.rate)
        print(json.dumps({"wake": wake}), flush=True)
    finally:
        stop_server(server)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = ROOT / "bench" / "results" / f"waiters-{stamp}.json"
    meta = {"when": stamp, "cpus": os.cpu_count(), "python": sys.version.split()[0]}
    out.write_text(json.dumps({"meta": meta, "idle": idle, "wake": wake}, indent=2, default=str))
    print(f"\nidle waiters: {idle['transactions_per_waiter_second']:.2f} transactions per waiter-second")
    lat = wake["latency_ms"]
    print(
        f"wake latency over {wake['granted']} of {wake['tasks']} tasks: p50 {lat['p50']:.1f} ms, "
        f"p95 {lat['p95']:.1f} ms, p99 {lat['p99']:.1f} ms, max {lat['max']:.1f} ms"
    )
    print(f"written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
