"""Read paths against a growing history (issue 13 item 7): every read — /metrics, the task lists, the rollout
(gates), coverage, drain, a task's events, mismatches, audit, the console pages — timed at each history size in one
run, so the ratios are comparable (2 shared vCPUs: compare within a run, never across runs).

    .venv/bin/python bench/history.py --database postgres://postgres@127.0.0.1:5432/controlplane_history \
        --sizes 10000 100000 1000000

The database is dropped and created afresh. History is written in bulk with SQL (committed tasks with their
attempts, staged results, timeline events — claims, commits, a reclaim and a fenced commit every 20th task —, legacy
rows, compared operations and audit entries), spread backwards from now at 2 s per task: the last hour holds the
same traffic at every size and the rest is history. A frontier of 300 READY tasks (plus 50 in a SHADOW namespace)
and 200 open mismatches stay the same at every size. After each growth the metric tallies are folded from the
beginning (``metrics_fold``, as the beat job's first run after an upgrade would), and that fold's time is reported
too. Each endpoint: one warm-up, then the median of ``--repeat`` requests through Django's test client (the view's
own cost: no network, no server). Writes bench/results/history-<timestamp>.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

NAMESPACES = ("default", "hist-shadow", "hist-reads")  # V1_ONLY (core), SHADOW, V1_READS
SPACING = 2.0  # seconds between tasks, backwards from now


def _psql(url: str, sql: str, db: str | None = None) -> None:
    parts = urlsplit(url)
    target = db or parts.path.lstrip("/")
    subprocess.run(
        [
            "psql",
            "-q",
            "-v",
            "ON_ERROR_STOP=1",
            "-h",
            parts.hostname or "127.0.0.1",
            "-p",
            str(parts.port or 5432),
        ]
        + ["-U", parts.username or "postgres", "-d", target, "-c", sql],
        check=True,
        stdout=subprocess.DEVNULL,
    )


def fresh_database(url: str) -> None:
    name = urlsplit(url).path.lstrip("/")
    _psql(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)', db="postgres")
    _psql(url, f'CREATE DATABASE "{name}"', db="postgres")


def setup() -> dict:
    from django.contrib.auth import get_user_model
    from django.contrib.auth.models import Group
    from django.core.management import call_command

    from claims.services import token_issue
    from rollout.services.state import namespace_create

    call_command("migrate", "--no-input", verbosity=0)
    operator = token_issue(name="bench-operator", role="operator")
    namespace_create(principal=operator.principal, name="hist-shadow", stage="SHADOW", min_protocol="legacy")
    namespace_create(principal=operator.principal, name="hist-reads", stage="V1_READS", min_protocol="legacy")
    user = get_user_model().objects.create_user(username="bench-op", password="bench-pw-123456")
    user.groups.set([Group.objects.get(name="operator")])
    return {"token": operator.token}


GROW = """
WITH ns AS (SELECT array_agg(id ORDER BY name = 'default' DESC, name) AS ids FROM claims_namespace
            WHERE name IN ('default', 'hist-shadow', 'hist-reads')),
s AS (
  SELECT i, now() - make_interval(secs => i * {spacing}) AS t,
         (SELECT ids FROM ns)[CASE WHEN i % 10 = 1 THEN 3 WHEN i % 10 = 2 THEN 2 ELSE 1 END] AS ns_id,
         md5('a' || i)::uuid AS a1, md5('b' || i)::uuid AS a2, md5('c' || i)::uuid AS commit_id,
         md5('s' || i)::uuid AS staged, i % 20 = 0 AS retried
  FROM generate_series({lo}, {hi} - 1) AS i
), tasks AS (
  INSERT INTO claims_task (task_id, node_id, input, input_digest, depends_on, replay_policy, resources, state,
    state_version, scheduler_epoch, claim_generation, attempt_id, owner_id, lease_expires_at, cancel_generation,
    result_commit_id, result_digest, result, created_at, updated_at, namespace_id, has_successors, has_resources)
  SELECT 'h-' || lpad(i::text, 8, '0'), 'node', '{{"i": 1}}', 'sha256:' || md5(i::text), '[]', 'REPLAYABLE', '[]',
    'COMMITTED', 3, 1, CASE WHEN retried THEN 2 ELSE 1 END, CASE WHEN retried THEN a2 ELSE a1 END, 'w1', NULL, 0,
    commit_id, 'sha256:' || md5('r' || i), '{{"ok": true}}', t, t + interval '1 second', ns_id, false, false
  FROM s RETURNING 1
), attempts AS (
  INSERT INTO claims_attempt (attempt_id, owner_id, pool, claim_generation, scheduler_epoch, cancel_generation,
    input_digest, started_at, ended_at, end_reason, namespace_id, task_id, fences)
  SELECT a1, 'w1', 'v1', 1, 1, 0, 'sha256:' || md5(i::text), t + interval '100 ms',
    CASE WHEN retried THEN t + interval '400 ms' ELSE t + interval '900 ms' END,
    CASE WHEN retried THEN 'RECLAIMED' ELSE 'COMMITTED' END, ns_id, 'h-' || lpad(i::text, 8, '0'), '{{}}'::jsonb FROM s
  UNION ALL
  SELECT a2, 'w2', 'v1', 2, 1, 0, 'sha256:' || md5(i::text), t + interval '500 ms', t + interval '900 ms',
    'COMMITTED', ns_id, 'h-' || lpad(i::text, 8, '0'), '{{}}'::jsonb FROM s WHERE retried
  RETURNING 1
), staged AS (
  INSERT INTO claims_stagedresult (staged_result_id, result, result_digest, staged_at, canonical, commit_id,
    committed_at, unblocked, attempt_id, task_id)
  SELECT staged, '{{"ok": true}}', 'sha256:' || md5('r' || i), t + interval '800 ms', true, commit_id,
    t + interval '900 ms', '[]', CASE WHEN retried THEN a2 ELSE a1 END, 'h-' || lpad(i::text, 8, '0') FROM s
  RETURNING 1
), legacy AS (
  INSERT INTO rollout_legacyclaim (task_id, namespace, owner_id, expires_at, result, result_digest, completed_by,
    via, pool, updated_at)
  SELECT 'h-' || lpad(i::text, 8, '0'), 'hist-shadow', 'w1', t + interval '30 seconds', '{{"ok": true}}',
    'sha256:' || md5('r' || i), 'w1', 'legacy', 'legacy', t + interval '900 ms' FROM s WHERE i % 10 = 1
  RETURNING 1
), compared AS (
  INSERT INTO rollout_comparedoperation (namespace, operation, api, agreed, at)
  SELECT 'hist-shadow', op, 'legacy', true, t + interval '200 ms'
  FROM s, unnest(ARRAY['claim', 'complete']) AS op WHERE i % 10 = 1
  RETURNING 1
), audit AS (
  INSERT INTO claims_auditentry (at, principal, role, action, namespace, target, reason, detail)
  SELECT t, 'bench-operator', 'operator', 'task_cancel', 'default', 'task:' || i, 'history', '{{}}'
  FROM s WHERE i % 100 = 0
  RETURNING 1
)
INSERT INTO claims_taskevent (kind, at, attempt_id, claim_generation, scheduler_epoch, owner_id, principal, point,
  detail, namespace_id, task_id, via)
SELECT e.kind, e.at, e.attempt, e.gen, 1, e.owner, coalesce(e.owner, 'bench-operator'), e.point, e.detail, s.ns_id, 'h-' || lpad(i::text, 8, '0'),
  CASE WHEN i % 10 = 1 AND e.point IS NOT NULL THEN 'legacy' ELSE '' END
FROM s CROSS JOIN LATERAL (VALUES
  ('task_created', t, NULL::uuid, NULL::bigint, NULL, NULL, '{{}}'::jsonb, true),
  ('claimed', t + interval '100 ms', a1, 1, 'w1', 'claim', '{{}}', true),
  ('reclaimed', t + interval '500 ms', a2, 2, 'w2', 'claim',
    jsonb_build_object('previous', jsonb_build_object('ended', 'lease_expired',
      'lease_expires_at', to_char((t + interval '400 ms') AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"+00:00"'))),
    retried),
  ('fenced', t + interval '600 ms', a1, 1, 'w1', 'commit',
    '{{"outcome": "FENCED", "reason": "GENERATION"}}', retried),
  ('result_committed', t + interval '900 ms', CASE WHEN retried THEN a2 ELSE a1 END,
    CASE WHEN retried THEN 2 ELSE 1 END, CASE WHEN retried THEN 'w2' ELSE 'w1' END, 'commit', '{{}}', true)
) AS e(kind, at, attempt, gen, owner, point, detail, keep)
WHERE e.keep
"""

FRONTIER = """
INSERT INTO claims_task (task_id, node_id, input, input_digest, depends_on, replay_policy, resources, state,
  state_version, scheduler_epoch, claim_generation, cancel_generation, created_at, updated_at, namespace_id,
  has_successors, has_resources)
SELECT 'ready-' || n.name || '-' || i, 'node', '{"i": 1}', 'sha256:' || md5(i::text), '[]', 'REPLAYABLE', '[]',
  'READY', 1, 1, 0, 0, now() - make_interval(secs => i), now(), n.id, false, false
FROM claims_namespace n, generate_series(1, CASE WHEN n.name = 'default' THEN 300 ELSE 50 END) AS i
WHERE n.name IN ('default', 'hist-shadow');
INSERT INTO rollout_mismatch (namespace, task_id, operation, api, legacy, v1, reason, status, note, reviewed_by, at)
SELECT 'hist-shadow', 'ready-hist-shadow-' || (i % 50 + 1), 'complete', 'legacy', '{}', '{}',
  'STALE_COMMIT_ACCEPTED', 'OPEN', '', '', now() - make_interval(secs => i * 60)
FROM generate_series(1, 200) AS i;
"""


def grow(url: str, lo: int, hi: int, chunk: int = 100_000) -> float:
    started = time.perf_counter()
    for a in range(lo, hi, chunk):
        b = min(hi, a + chunk)
        _psql(url, GROW.format(lo=a, hi=b, spacing=SPACING))
        print(f"  history {b:,} tasks ({time.perf_counter() - started:.0f} s)", flush=True)
    _psql(url, "VACUUM ANALYZE")
    return time.perf_counter() - started


def refold() -> float:
    from claims.models import MetricFold, MetricTally
    from claims.services.metrics import BEGINNING, metrics_fold

    MetricTally.objects.all().delete()
    MetricFold.objects.update(through=BEGINNING, folded_at=None)
    started = time.perf_counter()
    metrics_fold()
    return time.perf_counter() - started


def endpoints() -> dict[str, tuple[str, str]]:
    """name → (client, path): "api" with the operator's token, "console" logged in, "open" with nothing."""
    return {
        "/metrics": ("open", "/metrics"),
        "tasks?state=READY": ("api", "/api/v1/tasks?state=READY"),
        "tasks?state=READY (SHADOW ns)": ("api", "/api/v1/tasks?state=READY&namespace=hist-shadow"),
        "tasks (first page)": ("api", "/api/v1/tasks"),
        "tasks?state=COMMITTED&namespace=default": ("api", "/api/v1/tasks?state=COMMITTED&namespace=default"),
        "tasks?state=COMMITTED (SHADOW ns)": ("api", "/api/v1/tasks?state=COMMITTED&namespace=hist-shadow"),
        "tasks?state=COMMITTED": ("api", "/api/v1/tasks?state=COMMITTED"),
        "task events": ("api", "/api/v1/tasks/h-00000020/events"),
        "namespace": ("api", "/api/v1/namespaces/default"),
        "rollout (gate V1_READS→V1_WRITES)": ("api", "/api/v1/namespaces/hist-reads/rollout"),
        "rollout (gate SHADOW→V1_READS)": ("api", "/api/v1/namespaces/hist-shadow/rollout"),
        "coverage": ("api", "/api/v1/namespaces/hist-reads/coverage"),
        "drain": ("api", "/api/v1/namespaces/hist-shadow/drain"),
        "mismatches": ("api", "/api/v1/namespaces/hist-shadow/mismatches?status=OPEN"),
        "audit": ("api", "/api/v1/audit"),
        "console: overview": ("console", "/"),
        "console: namespace (SHADOW)": ("console", "/ns/hist-shadow/"),
        "console: tasks": ("console", "/tasks/"),
        "console: glance": ("console", "/glance/"),
        "console: pools": ("console", "/pools/"),
        "console: effects": ("console", "/effects/"),
    }


def measure(token: str, repeat: int) -> dict[str, float]:
    from django.test import Client

    clients = {"open": Client(), "api": Client(HTTP_AUTHORIZATION=f"Bearer {token}"), "console": Client()}
    assert clients["console"].login(username="bench-op", password="bench-pw-123456")
    out = {}
    for name, (which, path) in endpoints().items():
        client = clients[which]
        answer = client.get(path)
        assert answer.status_code == 200, (path, answer.status_code, answer.content[:300])
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            client.get(path)
            times.append((time.perf_counter() - started) * 1000)
        out[name] = round(statistics.median(times), 1)
        print(f"  {name:45} {out[name]:8.1f} ms", flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--database", required=True)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    fresh_database(args.database)
    os.environ.update(
        DATABASE_URL=args.database,
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        SECRET_KEY=os.environ.get("SECRET_KEY", "bench-history-" + "k" * 40 + "0123456789"),
        ALLOWED_HOSTS="testserver,localhost",
        API_RATE_LIMIT="",
        CELERY_TASK_ALWAYS_EAGER="true",
    )
    import django

    django.setup()
    made = setup()
    _psql(args.database, FRONTIER)
    from django.db import connections

    connections.close_all()  # sessions opened from here on carry the migrations' database settings (jit off)

    results: dict = {"sizes": {}, "started": datetime.now(UTC).isoformat()}
    have = 0
    for size in sorted(args.sizes):
        print(f"growing to {size:,} committed tasks", flush=True)
        grown = grow(args.database, have, size)
        have = size
        fold = refold()
        print(f"  fold from the beginning: {fold:.1f} s", flush=True)
        results["sizes"][size] = {"grow_seconds": round(grown, 1), "fold_seconds": round(fold, 2)}
        results["sizes"][size]["ms"] = measure(made["token"], args.repeat)

    sizes = sorted(results["sizes"])
    first, last = results["sizes"][sizes[0]]["ms"], results["sizes"][sizes[-1]]["ms"]
    results["ratio_last_to_first"] = {name: round(last[name] / max(first[name], 0.1), 2) for name in first}
    out = ROOT / "bench" / "results" / f"history-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.write_text(json.dumps(results, indent=2))
    header = " | ".join(f"{s:,}" for s in sizes)
    print(f"\n| endpoint (median ms) | {header} | {sizes[-1]:,} / {sizes[0]:,} |")
    print("|---|" + "---:|" * (len(sizes) + 1))
    for name in first:
        cells = " | ".join(str(results["sizes"][s]["ms"][name]) for s in sizes)
        print(f"| {name} | {cells} | {results['ratio_last_to_first'][name]}× |")
    print(f"\nwritten to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
