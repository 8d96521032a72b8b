"""Bounded soak: W worker processes doing claim-next + stage + commit through the service layer at a fixed share
of peak rate for a fixed time, reporting at intervals: throughput, p95 cycle latency, and the task table's dead
tuples and HOT-update ratio (pg_stat_user_tables).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/controlplane_bench .venv/bin/python bench/soak.py \
        --workers 8 --rate 150 --seconds 120 --every 15

--rate is the target total cycles per second (set it to a share of bench/claims.py's peak). Results are printed
and written to bench/results/soak-<timestamp>.json.

--retention SECONDS runs what beat would at each report — the metrics fold, then retention with RETENTION_SECONDS
set to that (and the rollout window below it) — and reports the rows of the timeline, attempt and audit tables:
they stop growing once the first tasks pass the window (docs/benchmarks.md, "Retention").
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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")


def _bench_claims():
    """bench/claims.py (seeding, percentiles), loaded by path: its name would shadow the claims app."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_claims", ROOT / "bench" / "claims.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def worker(index: int, namespace: str, seconds: float, per_worker_rate: float, queue: mp.Queue) -> None:
    import django

    django.setup()
    from claims import services as core
    from claims.digest import digest

    principal = core.token_issue(name=f"soak-{namespace}-{index}", role="worker").principal
    interval = 1.0 / per_worker_rate
    samples: list[tuple[float, float]] = []
    deadline = time.time() + seconds
    next_at = time.time()
    while time.time() < deadline:
        now = time.time()
        if now < next_at:
            time.sleep(next_at - now)
        next_at += interval
        started = time.perf_counter()
        grant = core.task_claim_next(
            principal=principal,
            owner_id=principal.name,
            scheduler_epoch=1,
            ttl_seconds=60,
            namespace=namespace,
        )
        if grant is None:
            break
        result = {"t": grant.task.task_id}
        core.result_stage(
            principal=principal,
            task_id=grant.task.task_id,
            attempt_id=grant.attempt_id,
            claim_generation=grant.task.claim_generation,
            result=result,
            result_digest=digest(result),
        )
        core.task_commit(
            principal=principal,
            task_id=grant.task.task_id,
            attempt_id=grant.attempt_id,
            scheduler_epoch=1,
            claim_generation=grant.task.claim_generation,
            observed_cancel_generation=0,
            input_digest=grant.task.input_digest,
            result_digest=digest(result),
        )
        samples.append((time.time(), time.perf_counter() - started))
    queue.put(samples)


def table_stats(cursor) -> dict:
    cursor.execute(
        "SELECT n_dead_tup, n_live_tup, n_tup_upd, n_tup_hot_upd, autovacuum_count, "
        "pg_total_relation_size('claims_task') FROM pg_stat_user_tables WHERE relname = 'claims_task'"
    )
    dead, live, upd, hot, vacuums, size = cursor.fetchone()
    return {
        "dead_tuples": dead,
        "live_tuples": live,
        "updates": upd,
        "hot_updates": hot,
        "autovacuums": vacuums,
        "table_bytes": size,
    }


def retain(cursor) -> dict:
    """What beat's fold_metrics and prune_history do, then the rows each retained table holds."""
    from claims.services.metrics import metrics_fold
    from claims.services.retention import history_prune

    metrics_fold()
    pruned = history_prune(budget_seconds=10)
    cursor.execute("SHOW autovacuum")
    if cursor.fetchone()[0] == "off":  # some CI images: do what autovacuum would, so freed space is reused
        cursor.execute("VACUUM claims_taskevent, claims_attempt, claims_stagedresult")
    out = {"pruned": pruned.events + pruned.attempts}
    for name, table in (
        ("events", "claims_taskevent"),
        ("attempts", "claims_attempt"),
        ("audit", "claims_auditentry"),
    ):
        cursor.execute(f"SELECT count(*), pg_total_relation_size('{table}') FROM {table}")
        out[name], out[f"{name}_bytes"] = cursor.fetchone()
    return out


def table_options(cursor) -> list[str]:
    """The task table's storage settings (fillfactor, per-table autovacuum) and the server's autovacuum switch,
    recorded with the results: a server with autovacuum off (some CI images) never cleans dead tuples."""
    cursor.execute("SELECT reloptions FROM pg_class WHERE relname = 'claims_task'")
    options = list(cursor.fetchone()[0] or [])
    cursor.execute("SHOW autovacuum")
    return [*options, f"server autovacuum={cursor.fetchone()[0]}"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--rate", type=float, default=150.0, help="target cycles/s in total")
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--every", type=float, default=15.0, help="report interval")
    parser.add_argument("--retention", type=int, default=0, help="fold + prune at each report, this window")
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("bench/soak.py needs DATABASE_URL=postgres://…")
    if args.retention:
        os.environ.update(
            RETENTION_SECONDS=str(args.retention),
            METRICS_FOLD_LAG_SECONDS="2",
            ROLLOUT_WINDOW_SECONDS=str(max(1, args.retention // 2)),
        )
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, connections

    call_command("migrate", verbosity=0)
    bench = _bench_claims()
    percentile = bench.percentile
    namespace = f"soak-{int(time.time())}"
    bench.seed(namespace, int(args.rate * args.seconds * 1.2) + 100)
    connections.close_all()
    ctx = mp.get_context("fork")
    queue: mp.Queue = ctx.Queue()
    procs = [
        ctx.Process(target=worker, args=(i, namespace, args.seconds, args.rate / args.workers, queue))
        for i in range(args.workers)
    ]
    started = time.time()
    for proc in procs:
        proc.start()
    reports = []
    with connection.cursor() as cursor:
        options = table_options(cursor)
        if "server autovacuum=off" in options:
            print(
                "warning: this server runs with autovacuum = off; dead tuples will only grow", file=sys.stderr
            )
        before = table_stats(cursor)
        # Workers stay alive until their samples are read, so report on the clock, not on their liveness.
        while time.time() - started < args.seconds:
            time.sleep(min(args.every, max(0.1, args.seconds - (time.time() - started))))
            if args.retention:
                stats_retention = retain(cursor)
            stats = table_stats(cursor)
            if args.retention:
                stats.update(stats_retention)
            upd = stats["updates"] - before["updates"]
            hot = stats["hot_updates"] - before["hot_updates"]
            reports.append(
                {
                    "t": round(time.time() - started, 1),
                    **stats,
                    "hot_ratio": round(hot / upd, 3) if upd else None,
                }
            )
            print(
                f"t={reports[-1]['t']:>6}s dead={stats['dead_tuples']:>7} hot_ratio={reports[-1]['hot_ratio']} "
                f"autovacuums={stats['autovacuums'] - before['autovacuums']}"
                + (
                    f" events={stats['events']} attempts={stats['attempts']} pruned={stats['pruned']}"
                    if args.retention
                    else ""
                ),
                flush=True,
            )
    samples = [s for _ in procs for s in queue.get(timeout=60)]
    for proc in procs:
        proc.join(10)
    windows = []
    for index, report in enumerate(reports):
        low = reports[index - 1]["t"] if index else 0
        in_window = [lat for at, lat in samples if low <= at - started < report["t"]]
        windows.append(
            {
                **report,
                "cycles_per_s": round(len(in_window) / (report["t"] - low), 1),
                "p95_ms": round(percentile(in_window, 95) * 1000, 1) if in_window else None,
            }
        )
    out = ROOT / "bench" / "results" / f"soak-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "table_options": options, "windows": windows}, indent=2))
    print(f"\nclaims_task options: {options}")
    print("\n| t (s) | cycles/s | p95 ms | dead tuples | HOT-update ratio | autovacuums | table MB |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for w in windows:
        print(
            f"| {w['t']} | {w['cycles_per_s']} | {w['p95_ms']} | {w['dead_tuples']} | {w['hot_ratio']} "
            f"| {w['autovacuums'] - before['autovacuums']} | {w['table_bytes'] / 1e6:.1f} |"
        )
    if args.retention:
        print(f"\nretention {args.retention} s: rows kept (and total MB) per report")
        print("| t (s) | events | events MB | attempts | attempts MB | audit | pruned this report |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for w in windows:
            print(
                f"| {w['t']} | {w['events']} | {w['events_bytes'] / 1e6:.1f} | {w['attempts']} "
                f"| {w['attempts_bytes'] / 1e6:.1f} | {w['audit']} | {w['pruned']} |"
            )
    print(f"\nwritten to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
