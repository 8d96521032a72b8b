"""The console's Metrics page against the hour's events (issue 24): its cost must be flat in them. The page reads the
per-minute tallies the fold keeps (``MinuteTally``) plus the stretch since the fold; before, it read every event of
the hour (199 ms at 13 k events, 365 ms at 26 k).

    .venv/bin/python bench/glance.py --database postgres://postgres@127.0.0.1:5432/controlplane_glance \
        --hour-tasks 4000 8000

For each size the database is made afresh and ``bench/history.py``'s history is written with all of it in the last
hour (``--hour-tasks`` tasks at 3600/N s apart: about 3.2 events each — created, claimed, committed, and a
reclaim and a fenced commit every 20th task), then folded once as the beat job would. Timed, through Django's test
client (the view's own cost), median of ``--repeat``: the Metrics page; the same figures computed from the hour's
events as the page did before (``tallies.per_minute`` over the hour — what the page would cost with no fold); and
the overview and a namespace page for reference. All in one run: compare the ratios, not the milliseconds.
Writes bench/results/glance-<timestamp>.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from history import GROW, _psql, fresh_database, setup  # noqa: E402 - after the path is set


def _timed(call, repeat: int) -> float:
    call()  # warm-up
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 1)


def measure(repeat: int) -> dict[str, float]:
    from django.test import Client

    from claims import clock, tallies
    from claims.models import TaskEvent

    console = Client()
    assert console.login(username="bench-op", password="bench-pw-123456")

    def page(path: str):
        def get():
            answer = console.get(path)
            assert answer.status_code == 200, (path, answer.status_code)

        return get

    def from_events():
        now = clock.now()
        tallies.per_minute(since=now - timedelta(hours=1), until=now)

    hour = TaskEvent.objects.filter(at__gte=clock.now() - timedelta(hours=1)).count()
    return {
        "events_in_the_hour": hour,
        "metrics page (tallies)": _timed(page("/glance/"), repeat),
        "the hour's figures from its events (before)": _timed(from_events, repeat),
        "overview (incident board)": _timed(page("/"), repeat),
        "namespace page (SHADOW)": _timed(page("/ns/hist-shadow/"), repeat),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database", required=True)
    parser.add_argument("--hour-tasks", type=int, nargs="+", default=[4000, 8000])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    os.environ.update(
        DATABASE_URL=args.database,
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        SECRET_KEY=os.environ.get("SECRET_KEY", "bench-glance-" + "k" * 40 + "0123456789"),
        ALLOWED_HOSTS="testserver,localhost",
        API_RATE_LIMIT="",
        CELERY_TASK_ALWAYS_EAGER="true",
        METRICS_FOLD_LAG_SECONDS="1",
    )
    import django

    django.setup()
    from django.db import connections

    from claims.services.metrics import metrics_fold

    results: dict = {"started": datetime.now(UTC).isoformat(), "sizes": {}}
    for tasks in sorted(args.hour_tasks):
        connections.close_all()
        fresh_database(args.database)
        setup()
        connections.close_all()
        spacing = 3600 / tasks
        _psql(args.database, GROW.format(lo=1, hi=tasks, spacing=spacing))
        _psql(args.database, "VACUUM ANALYZE")
        time.sleep(1.1)  # past the fold's lag
        started = time.perf_counter()
        metrics_fold()
        fold = round(time.perf_counter() - started, 2)
        figures = measure(args.repeat)
        figures["fold_seconds"] = fold
        results["sizes"][tasks] = figures
        print(f"{tasks:,} tasks in the hour: {json.dumps(figures)}", flush=True)
    sizes = sorted(results["sizes"])
    first, last = results["sizes"][sizes[0]], results["sizes"][sizes[-1]]
    results["ratio_last_to_first"] = {
        name: round(last[name] / max(first[name], 0.1), 2) for name in first if name != "fold_seconds"
    }
    out = ROOT / "bench" / "results" / f"glance-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.write_text(json.dumps(results, indent=2))
    header = " | ".join(f"{s:,} tasks" for s in sizes)
    print(f"\n| median ms | {header} | last / first |")
    print("|---|" + "---:|" * (len(sizes) + 1))
    for name in first:
        if name == "fold_seconds":
            continue
        cells = " | ".join(f"{results['sizes'][s][name]:,}" for s in sizes)
        print(f"| {name} | {cells} | {results['ratio_last_to_first'][name]}× |")
    print(f"\nwritten to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
