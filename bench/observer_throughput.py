"""Observe mode's throughput: how fast the observer judges a backlog (issue 34). The example application's workers
(with the stale-overwrite injector) write their table for --seconds while nobody observes; then the observer, in this
process, judges the whole backlog: changes judged per second and CPU milliseconds per change (process time of this
process: the observer and our database's client side; the databases' own CPU is not counted).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/controlplane_bench \\
    LEGACY_DATABASE_URL=postgres://postgres@127.0.0.1:5433/controlplane_observe \\
        .venv/bin/python bench/observer_throughput.py --seconds 20

LEGACY_DATABASE_URL=mysql://… reads the binary log where the server keeps one (LEGACY_OBSERVE_MYSQL=poll: polling).
Results are printed and written to bench/results/observer-throughput-<method>-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _soak_module():
    spec = importlib.util.spec_from_file_location("bench_legacy_soak", ROOT / "bench" / "legacy_soak.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    soak = _soak_module()
    namespace = f"tput-{datetime.now(UTC):%m%d%H%M%S}"
    soak.configure(namespace)
    import django

    django.setup()
    from claims import services as core
    from examples.legacy_jobs.app import SCHEMA, Truth, TruthfulWorker, run_with_truth
    from rollout.models import ObserverPosition
    from rollout.services import observers, stages, state
    from tests.support.legacy_db import Their, connect, forget_observer

    their = Their("legacy")
    forget_observer(their)
    their.sql("DROP TABLE IF EXISTS jobs")
    their.sql(SCHEMA[their.dialect])
    if not their.mysql:
        their.sql("ALTER TABLE jobs REPLICA IDENTITY FULL")
    keys = [f"{namespace}-{i:06d}" for i in range(2000)]
    for start in range(0, len(keys), 500):
        chunk = keys[start : start + 500]
        their.sql(
            "INSERT INTO jobs (job_id, queue, payload) VALUES "
            + ", ".join(["(%s, 'soak', '{}')"] * len(chunk)),
            chunk,
        )
    oncall = core.principal_ensure(name="tput-oncall", role="oncall")
    state.namespace_create(principal=oncall, name=namespace, stage="LEGACY", min_protocol="legacy")
    observers.setup()
    stages.advance(principal=oncall, namespace=namespace, to_stage="SHADOW", reason="bench", override=True)
    observers.once(limit=5000)  # the import's own writes, if any, out of the way
    position = ObserverPosition.objects.get(name=observers.position_name())
    before = position.judged
    truth, stop = Truth(), threading.Event()
    workers = [
        TruthfulWorker(lambda: connect("legacy"), their.dialect, f"tw-{i}", ttl=1.0, truth=truth, margin=0.4)
        for i in range(args.workers)
    ]
    threads = [
        threading.Thread(
            target=run_with_truth, args=(w, "soak", stop), kwargs={"stale_every": 5, "work": 0.15}
        )
        for w in workers
    ]
    for thread in threads:
        thread.start()
    time.sleep(args.seconds)
    stop.set()
    for thread in threads:
        thread.join(30)
    started, cpu = time.perf_counter(), time.process_time()
    passes = 0
    while observers.once(limit=500)["read"]:
        passes += 1
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    judged = ObserverPosition.objects.get(name=observers.position_name()).judged - before
    result = {
        "bench": "observer_throughput",
        "at": datetime.now(UTC).isoformat(),
        "method": observers.method(),
        "backlog_written_seconds": args.seconds,
        "legacy_workers": args.workers,
        "legacy_completes": len(truth.completes),
        "judged": judged,
        "passes": passes,
        "seconds": round(seconds, 2),
        "judged_per_second": round(judged / seconds, 1),
        "cpu_ms_per_change": round(1000 * cpu / max(judged, 1), 2),
    }
    print(json.dumps(result, indent=2))
    out = (
        ROOT
        / "bench"
        / "results"
        / f"observer-throughput-{result['method']}-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    )
    out.write_text(json.dumps(result, indent=2) + "\n")
    os._exit(0)


if __name__ == "__main__":
    main()
