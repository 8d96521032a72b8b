"""Benchmark: claim-next + inline commit cycles (claim-v1.md §9; two transactions) through the service layer vs.
the same cycle in raw SQL. (Results recorded before issue 12 were of the three-transaction cycle: claim-next, stage,
commit.)

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/controlplane_bench .venv/bin/python bench/claims.py

For each concurrency level (1, 4, 16, 32 workers) it seeds a fresh namespace with READY tasks, then

1. runs W worker *processes* for --seconds, each looping task_claim_next → task_commit (result inline) through
   claims.services (the same functions the API calls, minus HTTP and auth), timing every cycle;
2. runs pgbench with W clients for --seconds on the same database, with bench/cycle.sql: the same three
   transactions written as raw SQL (namespace FOR SHARE, SKIP LOCKED pick and claim, attempt and event rows;
   locked re-check, staged row and event, task/attempt/staged updates, successor probe, event).

and reports cycles/s and p50/p95/p99 cycle latency for both, the ratio, and a double-claim audit: every task
claimed by the service path must have exactly one attempt and at most one canonical result.
Results are printed as a Markdown table and written to bench/results/claims-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
# Both sides send statements with their values inlined and unprepared: Django's default psycopg client-side
# binding for the service path, pgbench -M simple for raw SQL.

INPUT = {"bench": True}


def _setup_django() -> None:
    import django

    django.setup()


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def seed(namespace: str, count: int) -> int:
    """A fresh namespace with ``count`` READY tasks; returns its id."""
    from django.db import connection
    from django.utils import timezone

    from claims.digest import digest
    from claims.models import Namespace

    now = timezone.now()
    ns, _ = Namespace.objects.get_or_create(name=namespace, defaults={"created_at": now, "updated_at": now})
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO claims_task (task_id, namespace_id, node_id, input, input_digest, depends_on, replay_policy,
                resources, has_successors, has_resources, state, state_version, scheduler_epoch, claim_generation, cancel_generation, created_at,
                updated_at)
            SELECT %s || '-' || g, %s, 'bench', %s::jsonb, %s, '[]'::jsonb, 'REPLAYABLE', '[]'::jsonb, false, false, 'READY', 1, 0,
                0, 0, now() + g * interval '1 microsecond', now()
            FROM generate_series(1, %s) AS g
            """,
            [namespace, ns.id, json.dumps(INPUT), digest(INPUT), count],
        )
        cursor.execute("ANALYZE claims_task")  # as autovacuum would after a bulk load
    return ns.id


def service_worker(index: int, namespace: str, seconds: float, queue: mp.Queue) -> None:
    _setup_django()
    from claims import services
    from claims.digest import digest
    from claims.services import token_issue

    principal = token_issue(name=f"bench-{namespace}-{index}", role="worker", pool="v1").principal
    latencies: list[float] = []
    claimed: list[str] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.perf_counter()
        grant = services.task_claim_next(
            principal=principal,
            owner_id=principal.name,
            scheduler_epoch=1,
            ttl_seconds=300,
            namespace=namespace,
        )
        if grant is None:
            break
        task = grant.task
        result = {"task": task.task_id, "by": principal.name}
        committed = services.task_commit(
            principal=principal,
            task_id=task.task_id,
            attempt_id=grant.attempt_id,
            scheduler_epoch=1,
            claim_generation=task.claim_generation,
            observed_cancel_generation=task.cancel_generation,
            input_digest=task.input_digest,
            result_digest=digest(result),
            result=result,  # claim-v1.md §9: staged in the commit's transaction
        )
        if committed.repeat:
            errors += 1
        latencies.append(time.perf_counter() - started)
        claimed.append(task.task_id)
    queue.put({"latencies": latencies, "claimed": claimed, "errors": errors})


def run_service(workers: int, seconds: float, tasks: int) -> dict:
    from django.db import connections

    namespace = f"bench-svc-{workers}-{int(time.time())}"
    seed(namespace, tasks)
    connections.close_all()  # never share a connection across fork
    ctx = mp.get_context("fork")
    queue: mp.Queue = ctx.Queue()
    procs = [ctx.Process(target=service_worker, args=(i, namespace, seconds, queue)) for i in range(workers)]
    started = time.perf_counter()
    for proc in procs:
        proc.start()
    outputs = [queue.get(timeout=seconds + 120) for _ in procs]
    for proc in procs:
        proc.join(30)
    elapsed = time.perf_counter() - started
    latencies = [lat for out in outputs for lat in out["latencies"]]
    claimed = [task for out in outputs for task in out["claimed"]]
    audit = double_claim_audit(namespace, claimed)
    return {
        "cycles": len(latencies),
        "elapsed": elapsed,
        "rate": len(latencies) / seconds,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p95_ms": percentile(latencies, 95) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        **audit,
    }


def double_claim_audit(namespace: str, claimed: list[str]) -> dict:
    """Zero double claims: no task handed to two cycles, one attempt and one canonical result per committed task."""
    from django.db.models import Count

    from claims.models import Attempt, StagedResult, Task

    handed_twice = len(claimed) - len(set(claimed))
    multi_attempts = (
        Attempt.objects.filter(task__namespace__name=namespace)
        .values("task_id")
        .annotate(n=Count("pk"))
        .filter(n__gt=1)
        .count()
    )
    multi_canonical = (
        StagedResult.objects.filter(task__namespace__name=namespace, canonical=True)
        .values("task_id")
        .annotate(n=Count("pk"))
        .filter(n__gt=1)
        .count()
    )
    committed = Task.objects.filter(namespace__name=namespace, state="COMMITTED").count()
    return {
        "double_claims": handed_twice + multi_attempts,
        "multi_canonical": multi_canonical,
        "committed_rows": committed,
    }


def run_pgbench(workers: int, seconds: float, tasks: int) -> dict:
    from django.conf import settings

    namespace = f"bench-raw-{workers}-{int(time.time())}"
    ns_id = seed(namespace, tasks)
    db = settings.DATABASES["default"]
    env = {**os.environ, "PGPASSWORD": db.get("PASSWORD") or ""}
    with tempfile.TemporaryDirectory() as logdir:
        command = [
            "pgbench",
            "-n",
            "-M",
            "simple",
            "-c",
            str(workers),
            "-j",
            str(min(workers, 4)),
            "-T",
            str(int(seconds)),
            "-f",
            str(ROOT / "bench" / "cycle.sql"),
            "-D",
            f"nsid={ns_id}",
            "-l",
            "--log-prefix",
            f"{logdir}/pgbench",
            "-h",
            db.get("HOST") or "127.0.0.1",
            "-p",
            str(db.get("PORT") or 5432),
            "-U",
            db.get("USER") or "postgres",
            db["NAME"],
        ]
        proc = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"pgbench failed:\n{proc.stdout}\n{proc.stderr}")
        latencies = []
        for log in Path(logdir).glob("pgbench*"):
            for line in log.read_text().splitlines():
                parts = line.split()
                latencies.append(int(parts[2]) / 1e6)  # client_id xact_no time_us ...
    from django.db.models import Count

    from claims.models import Task

    committed = Task.objects.filter(namespace_id=ns_id, state="COMMITTED").count()
    over = Task.objects.filter(namespace_id=ns_id, claim_generation__gt=1).aggregate(n=Count("pk"))["n"]
    return {
        "cycles": len(latencies),
        "rate": len(latencies) / seconds,
        "p50_ms": percentile(latencies, 50) * 1000,
        "p95_ms": percentile(latencies, 95) * 1000,
        "p99_ms": percentile(latencies, 99) * 1000,
        "committed_rows": committed,
        "double_claims": over,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", default="1,4,16,32")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--tasks", type=int, default=60000, help="READY tasks seeded per level and path")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("bench/claims.py needs DATABASE_URL=postgres://… (a database of its own: it seeds tasks)")
    _setup_django()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    rows = []
    for workers in [int(w) for w in args.workers.split(",")]:
        service = run_service(workers, args.seconds, args.tasks)
        raw = run_pgbench(workers, args.seconds, args.tasks)
        rows.append(
            {"workers": workers, "service": service, "raw_sql": raw, "ratio": service["rate"] / raw["rate"]}
        )
        print(
            f"workers={workers}: service {service['rate']:.0f}/s, raw {raw['rate']:.0f}/s, "
            f"ratio {service['rate'] / raw['rate']:.2f}, double claims {service['double_claims']}",
            flush=True,
        )
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = ROOT / "bench" / "results" / f"claims-{stamp}.json"
    out.parent.mkdir(exist_ok=True)
    meta = {"when": stamp, "seconds": args.seconds, "cpus": os.cpu_count(), "python": sys.version.split()[0]}
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    print()
    print(
        "| workers | service cycles/s | p50 ms | p95 ms | p99 ms | raw SQL cycles/s | p50 ms | p95 ms | p99 ms "
        "| service ÷ raw | double claims |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        s, r = row["service"], row["raw_sql"]
        print(
            f"| {row['workers']} | {s['rate']:.0f} | {s['p50_ms']:.1f} | {s['p95_ms']:.1f} | {s['p99_ms']:.1f} "
            f"| {r['rate']:.0f} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} | {r['p99_ms']:.1f} | {row['ratio']:.2f} "
            f"| {s['double_claims'] + s['multi_canonical']} |"
        )
    print(f"\nwritten to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
