"""The side-by-side benchmark of issue 12, in one run on one PostgreSQL database:

- HTTP, single item: claim-next → commit with the result inline (two requests a cycle), W worker processes;
- HTTP, batched: claim 10 in one request, commit 10 in one request;
- the service layer: the same two-transaction cycle through claims.services (bench/claims.py);
- raw SQL: the same cycle as pgbench runs it (bench/cycle.sql);
- PgQueuer 1.6 (batch 1 and batch 10) and procrastinate 3.10 doing claim + complete (the ``bench`` extra);

then the wake-up latency (READY → a waiting worker's grant, from the rows' own database timestamps) and what idle
waiters cost one server process (threads, memory). The server is gunicorn with uvicorn workers
(deploy/gunicorn.conf.py), 2 processes, pooled connections, no rate limit.

    dropdb --if-exists controlplane_bench; createdb controlplane_bench   # fresh: what earlier runs leave weighs on the figures
    pip install '.[bench]'
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/controlplane_bench python bench/sidebyside.py --seconds 10

Writes bench/results/sidebyside-<timestamp>.json and prints the Markdown table recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")


SERVER_ENV: dict[str, str] = {}  # what --server-settings changes for the server alone


def start_server(port: int, processes: int) -> subprocess.Popen:
    env = {
        **os.environ,
        "DATABASE_POOL": "true",
        "API_RATE_LIMIT": "",
        "BIND": f"127.0.0.1:{port}",
        **SERVER_ENV,
    }
    env["WEB_CONCURRENCY"] = str(processes)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-c",
            str(ROOT / "deploy/gunicorn.conf.py"),
            "controlplane.asgi:application",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    import httpx

    for _ in range(100):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/v1/schema/", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.2)
    raise RuntimeError("the server did not start")


def stop_server(server: subprocess.Popen) -> None:
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(30)


def tokens(prefix: str, count: int) -> list[tuple[str, str]]:
    from claims.services import token_issue

    issued = [token_issue(name=f"{prefix}-{i}", role="worker", pool="v1") for i in range(count)]
    return [(t.principal.name, t.token) for t in issued]


def audit(namespace: str, handed: list[str]) -> int:
    """Tasks handed to two attempts: a task given out twice in the run, or with more than one attempt row."""
    from django.db.models import Count

    from claims.models import Attempt

    twice = len(handed) - len(set(handed))
    multi = (
        Attempt.objects.filter(task__namespace__name=namespace)
        .values("task_id")
        .annotate(n=Count("pk"))
        .filter(n__gt=1)
        .count()
    )
    return twice + multi


def run_http(url: str, workers: int, seconds: float, batch: int, tasks: int) -> dict[str, Any]:
    from django.db import connections

    from bench import http_client
    from bench.claims import seed

    namespace = f"bench-http{batch}-{workers}-{int(time.time())}"
    seed(namespace, tasks)
    result = http_client.run(url, tokens(namespace, workers), namespace, seconds, batch)
    connections.close_all()
    result["double"] = audit(namespace, result.pop("handed"))
    return result


def wake_latency(url: str, waiters: int, rounds: int) -> dict[str, Any]:
    """W workers wait (wait_seconds=30) on an empty namespace; tasks are created one at a time; latency is the
    claim's attempt.started_at minus the task's created_at — both read from the database clock."""
    import httpx

    from claims.models import Attempt, Namespace, Task
    from claims.services import token_issue

    namespace = f"bench-wake-{int(time.time())}"
    Namespace.objects.create(name=namespace, created_at=datetime.now(UTC), updated_at=datetime.now(UTC))
    workers = tokens(namespace, waiters)
    operator = token_issue(name=f"{namespace}-op", role="operator").token

    async def waiter(owner: str, token: str, stop: asyncio.Event) -> None:
        body = {
            "owner_id": owner,
            "scheduler_epoch": 1,
            "ttl_seconds": 300,
            "namespace": namespace,
            "wait_seconds": 30,
        }
        async with httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=40
        ) as http:
            while not stop.is_set():
                await http.post("/api/v1/claims", json=body)

    async def main() -> None:
        stop = asyncio.Event()
        running = [asyncio.create_task(waiter(o, t, stop)) for o, t in workers]
        await asyncio.sleep(2)  # all waiting
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {operator}"}) as http:
            for i in range(rounds):
                await http.post(
                    "/api/v1/tasks", json={"namespace": namespace, "node_id": f"w{i}", "input": {"i": i}}
                )
                await asyncio.sleep(0.2)
        await asyncio.sleep(1)
        stop.set()
        # end the waits: a fence answers every waiter at once
        from asgiref.sync import sync_to_async

        from claims.services import epoch_fence
        from claims.services import token_issue as issue

        oncall = await sync_to_async(issue)(name=f"{namespace}-oncall", role="oncall")
        await sync_to_async(epoch_fence)(principal=oncall.principal, namespace=namespace, reason="bench over")
        await asyncio.gather(*running, return_exceptions=True)

    asyncio.run(main())
    started = dict(Attempt.objects.filter(namespace__name=namespace).values_list("task_id", "started_at"))
    created = dict(Task.objects.filter(namespace__name=namespace).values_list("task_id", "created_at"))
    latencies = sorted((started[t] - created[t]).total_seconds() * 1000 for t in started)
    pct = lambda q: latencies[min(len(latencies) - 1, round(q / 100 * (len(latencies) - 1)))]  # noqa: E731
    return {
        "tasks": len(created),
        "claimed": len(latencies),
        "p50_ms": pct(50),
        "p95_ms": pct(95),
        "max_ms": latencies[-1],
    }


def idle_waiters(url: str, server_pid: int, count: int) -> dict[str, Any]:
    """``count`` claims waiting at once on one server process (the server runs 1 process for this): its threads
    and resident memory before and while they wait."""
    import httpx

    namespace = f"bench-idle-{int(time.time())}"
    from claims.models import Namespace

    Namespace.objects.create(name=namespace, created_at=datetime.now(UTC), updated_at=datetime.now(UTC))
    owner, token = tokens(namespace, 1)[0]
    worker_pid = int(subprocess.check_output(["pgrep", "-P", str(server_pid)]).split()[0])

    def status() -> dict[str, int]:
        fields = dict(
            line.split(":", 1)
            for line in Path(f"/proc/{worker_pid}/status").read_text().splitlines()
            if ":" in line
        )
        return {"threads": int(fields["Threads"]), "rss_kib": int(fields["VmRSS"].split()[0])}

    async def main() -> dict[str, Any]:
        before = status()
        limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=count + 10)
        body = {
            "owner_id": owner,
            "scheduler_epoch": 1,
            "ttl_seconds": 300,
            "namespace": namespace,
            "wait_seconds": 20,
        }
        async with httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60, limits=limits
        ) as http:
            running = [asyncio.create_task(http.post("/api/v1/claims", json=body)) for _ in range(count)]
            await asyncio.sleep(8)
            during = status()
            answers = await asyncio.gather(*running, return_exceptions=True)
        codes: dict[str, int] = {}
        for answer in answers:
            key = str(getattr(answer, "status_code", type(answer).__name__))
            codes[key] = codes.get(key, 0) + 1
        return {"waiters": count, "before": before, "during": during, "answers": codes}

    return asyncio.run(main())


def batch_bar(
    url: str, pg_dsn: str, *, port: int, workers: int, seconds: float, tasks: int, repeat: int
) -> dict:
    """Issue 22's bar, in one run: batched HTTP at N=10 and N=100 against PgQueuer at batch 1 and batch 10, the same
    W workers. Each comparison is measured A-B-B-A (HTTP, PgQueuer, PgQueuer, HTTP, each for half of ``seconds``),
    so that a machine growing slower or faster during the comparison weighs on both sides alike — on this shared
    machine one path measured twice a minute apart can differ by 1.5×. ``repeat`` rounds; the ratios of each round,
    and their spread."""
    from django.db import connections

    from bench import queues

    half = seconds / 2

    def http(batch: int, count: int) -> dict[str, Any]:
        server = start_server(port, 2)
        try:
            return run_http(url, workers, half, batch, count)
        finally:
            stop_server(server)
            connections.close_all()

    def pgqueuer(batch: int, count: int) -> dict[str, Any]:
        return queues.run_pgqueuer(pg_dsn, workers, half, batch, count)

    rounds = []
    for _ in range(repeat):
        row: dict[str, Any] = {}
        for http_key, batch, pgq_key, pgq_batch, scale in [
            ("http_batch10", 10, "pgqueuer_b1", 1, 3),
            ("http_batch100", 100, "pgqueuer_b10", 10, 6),
        ]:
            first = http(batch, tasks * scale)
            theirs = [pgqueuer(pgq_batch, tasks * pgq_batch), pgqueuer(pgq_batch, tasks * pgq_batch)]
            last = http(batch, tasks * scale)
            row[http_key] = _joined([first, last], seconds)
            row[pgq_key] = {
                "completed": sum(r["completed"] for r in theirs),
                "rate": sum(r["completed"] for r in theirs) / seconds,
                "halves": [r["rate"] for r in theirs],
            }
        row["ratios"] = {
            "n10_over_pgqueuer_b1": row["http_batch10"]["rate"] / row["pgqueuer_b1"]["rate"],
            "n100_over_pgqueuer_b10": row["http_batch100"]["rate"] / row["pgqueuer_b10"]["rate"],
        }
        summary = {k: v["rate"] if "rate" in v else v for k, v in row.items()}
        print(json.dumps(summary), flush=True)
        rounds.append(row)
    return {"workers": workers, "order": "A-B-B-A per comparison, each half of the seconds", "rounds": rounds}


def _database_load() -> dict[str, Any]:
    """The tasks and the size of the database before the run (the bar is meant for a fresh one: createdb)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM claims_task")
        (tasks,) = cursor.fetchone()
        cursor.execute("SELECT pg_database_size(current_database())")
        (size,) = cursor.fetchone()
    if tasks > 1_000_000:
        print(
            f"warning: {tasks:,} tasks already in this database; the bar is meant for a fresh one", flush=True
        )
    return {"tasks": tasks, "bytes": size}


def _joined(halves: list[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """Two HTTP measurements of one path as one: tasks, rate over their seconds together, the worse percentiles."""
    tasks = sum(h["tasks"] for h in halves)
    return {
        "tasks": tasks,
        "rate": tasks / seconds,
        "halves": [h["rate"] for h in halves],
        "p50_ms": max(h["p50_ms"] for h in halves),
        "p95_ms": max(h["p95_ms"] for h in halves),
        "errors": sum(h["errors"] for h in halves),
        "client_cpu_s": sum(h["client_cpu_s"] for h in halves),
        "handed_twice": sum(h["handed_twice"] for h in halves),
        "double": sum(h["double"] for h in halves),
    }


def _print_bar(bar: dict) -> None:
    rounds = bar["rounds"]
    print(
        f"\n| path (W={bar['workers']}) | " + " | ".join(f"round {i + 1}" for i in range(len(rounds))) + " |"
    )
    print("|---|" + "---:|" * len(rounds))
    for label, key in [
        ("HTTP batched, N=10", "http_batch10"),
        ("HTTP batched, N=100", "http_batch100"),
        ("PgQueuer batch 1", "pgqueuer_b1"),
        ("PgQueuer batch 10", "pgqueuer_b10"),
    ]:
        print(f"| {label} | " + " | ".join(f"{r[key]['rate']:,.0f} /s" for r in rounds) + " |")
    for label, key in [
        ("N=10 ÷ PgQueuer batch 1 (target ≥ 1)", "n10_over_pgqueuer_b1"),
        ("N=100 ÷ PgQueuer batch 10 (target ≥ 0.3)", "n100_over_pgqueuer_b10"),
    ]:
        values = [r["ratios"][key] for r in rounds]
        print(
            f"| {label} | "
            + " | ".join(f"{v:.2f}" for v in values)
            + f" |  (min {min(values):.2f}, max {max(values):.2f})"
        )
    doubles = sum(r[k]["double"] + r[k]["errors"] for r in rounds for k in ("http_batch10", "http_batch100"))
    print(f"| tasks handed twice or refused | {doubles} |")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", default="4,16")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--tasks", type=int, default=30000)
    parser.add_argument("--port", type=int, default=8111)
    parser.add_argument("--idle", type=int, default=1000, help="idle waiters held by one server process")
    parser.add_argument(
        "--batch-bar",
        action="store_true",
        help="only the batched bar: N=10 and N=100 against PgQueuer, repeated",
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--server-settings",
        default="",
        help="the server's DJANGO_SETTINGS_MODULE (controlplane.settings.core: the product once the rollout is "
        "removed, docs/architecture.md); default: the whole control plane",
    )
    args = parser.parse_args()
    if args.server_settings:
        SERVER_ENV["DJANGO_SETTINGS_MODULE"] = args.server_settings
    dsn = os.environ.get("DATABASE_URL", "")
    if not dsn.startswith("postgres"):
        sys.exit("bench/sidebyside.py needs DATABASE_URL=postgres://… (a database of its own)")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    from bench import queues
    from bench.claims import run_pgbench, run_service

    call_command("migrate", verbosity=0)
    pg_dsn = dsn.replace("postgres://", "postgresql://", 1)
    url = f"http://127.0.0.1:{args.port}"
    if args.batch_bar:
        workers = int(args.workers.split(",")[0])
        before = _database_load()
        bar = batch_bar(
            url,
            pg_dsn,
            port=args.port,
            workers=workers,
            seconds=args.seconds,
            tasks=args.tasks,
            repeat=args.repeat,
        )
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        out = ROOT / "bench" / "results" / f"batchbar-{stamp}.json"
        meta = {
            "when": stamp,
            "seconds": args.seconds,
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "server_settings": args.server_settings or "controlplane.settings",
            # What earlier runs left in the database: a bench database of 15M tasks (16 GB) measured N=10 at
            # 0.99-1.18 where a fresh one gave 1.22-1.27 minutes later (docs/benchmarks.md).
            "database_before": before,
        }
        out.write_text(json.dumps({"meta": meta, "bar": bar}, indent=2, default=str))
        _print_bar(bar)
        print(f"\nwritten to {out.relative_to(ROOT)}")
        return
    rows = []
    for workers in [int(w) for w in args.workers.split(",")]:
        row: dict[str, Any] = {"workers": workers}
        server = start_server(args.port, 2)
        try:
            row["http_single"] = run_http(url, workers, args.seconds, 1, args.tasks)
            row["http_batch10"] = run_http(url, workers, args.seconds, 10, args.tasks * 3)
        finally:
            stop_server(server)
        connections.close_all()
        row["service"] = run_service(workers, args.seconds, args.tasks)
        row["raw_sql"] = run_pgbench(workers, args.seconds, args.tasks)
        row["pgqueuer_b1"] = queues.run_pgqueuer(pg_dsn, workers, args.seconds, 1, args.tasks)
        row["pgqueuer_b10"] = queues.run_pgqueuer(pg_dsn, workers, args.seconds, 10, args.tasks * 10)
        row["procrastinate"] = queues.run_procrastinate(pg_dsn, workers, args.seconds, args.tasks)
        row["ratios"] = {
            "http_single_over_service": row["http_single"]["rate"] / row["service"]["rate"],
            "http_batch10_over_pgqueuer_b1": row["http_batch10"]["rate"] / row["pgqueuer_b1"]["rate"],
            "service_over_raw_sql": row["service"]["rate"] / row["raw_sql"]["rate"],
        }
        print(
            json.dumps(
                {
                    k: (v if k == "workers" else {kk: vv for kk, vv in v.items() if kk != "latencies"})
                    for k, v in row.items()
                }
            ),
            flush=True,
        )
        rows.append(row)
    connections.close_all()
    server = start_server(args.port, 2)
    try:
        wake = wake_latency(url, 8, 40)
    finally:
        stop_server(server)
    server = start_server(args.port, 1)
    try:
        idle = idle_waiters(url, server.pid, args.idle)
    finally:
        stop_server(server)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = ROOT / "bench" / "results" / f"sidebyside-{stamp}.json"
    meta = {"when": stamp, "seconds": args.seconds, "cpus": os.cpu_count(), "python": sys.version.split()[0]}
    out.write_text(
        json.dumps({"meta": meta, "rows": rows, "wake": wake, "idle": idle}, indent=2, default=str)
    )
    print()
    print("| path | " + " | ".join(f"W={r['workers']}" for r in rows) + " |")
    print("|---|" + "---:|" * len(rows))
    paths = [
        ("HTTP single item (claim-next + inline commit)", "http_single"),
        ("HTTP batched, N=10 (claim 10 + commit 10)", "http_batch10"),
        ("service layer (same cycle, no HTTP)", "service"),
        ("raw SQL (bench/cycle.sql, pgbench)", "raw_sql"),
        ("PgQueuer batch 1, claim + complete", "pgqueuer_b1"),
        ("PgQueuer batch 10", "pgqueuer_b10"),
        ("procrastinate, claim + complete", "procrastinate"),
    ]
    for label, key in paths:
        print(f"| {label} | " + " | ".join(f"{r[key]['rate']:,.0f} /s" for r in rows) + " |")
    for label, key in [
        ("single HTTP ÷ service (target ≥ 0.5)", "http_single_over_service"),
        ("batched HTTP ÷ PgQueuer batch 1 (target ≥ 1)", "http_batch10_over_pgqueuer_b1"),
        ("service ÷ raw SQL (target ≥ 0.6)", "service_over_raw_sql"),
    ]:
        print(f"| {label} | " + " | ".join(f"{r['ratios'][key]:.2f}" for r in rows) + " |")
    doubles = [
        r["http_single"]["double"] + r["http_batch10"]["double"] + r["service"]["double_claims"] for r in rows
    ]
    print("| tasks handed to two attempts | " + " | ".join(str(d) for d in doubles) + " |")
    print(
        f"\nwake-up READY → grant: p50 {wake['p50_ms']:.1f} ms, p95 {wake['p95_ms']:.1f} ms ({wake['claimed']}/{wake['tasks']})"
    )
    print(f"idle waiters: {json.dumps(idle)}")
    print(f"\nwritten to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
