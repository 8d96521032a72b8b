"""Benchmark (issue 39, 6): the control plane on a Patroni cluster, failing over under load.

    .venv/bin/python bench/failover.py [--failovers 10] [--seconds 600] [--baseline-seconds 60] [--workers 4]

Needs root (scripts/ha-cluster.sh installs Patroni and etcd, and runs PostgreSQL as postgres) and the local
PostgreSQL on 127.0.0.1:5432 for the single-node baseline. In one run, on one machine:

1. **Throughput**: the same chaos workers (tests/chaos/worker.py, no think time: claim-next, stage, commit) for
   ``--baseline-seconds`` against the production server on a single PostgreSQL node, then on the cluster with
   synchronous replication, then asynchronous — commits/s of each, and each cluster's as a ratio to the single node.
2. **Synchronous failovers**: ``--failovers`` SIGKILLed leaders spread over ``--seconds`` under that load (a quarter
   of the tasks with an effect). Counted against the last leader's rows: acknowledged grants, commits and effect
   outcomes lost (0 is the promise), anything issued twice, stale tokens refused, the first successful claim of each
   worker after each failover (p50, p99), and the run's timelines replayed against model/trace.pml.
3. **Asynchronous failovers**: the same, with replication cut a moment before each kill (a partition): what the
   leader acknowledged in that moment is lost on purpose. Counted: the decisions lost, and the failover fences that
   refused the lost tokens (FENCED, EPOCH) when their workers came back.

Writes bench/results/failover-<timestamp>.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings.test")

import django  # noqa: E402

django.setup()
logging.getLogger("httpx").setLevel(logging.WARNING)

from deploy.topology import AppServer  # noqa: E402
from tests.effect_target import EffectTarget  # noqa: E402
from tests.gateway.support import counting_downstream  # noqa: E402
from tests.support import ha, trace  # noqa: E402
from tests.support.processes import server_env  # noqa: E402

SINGLE = "postgres://postgres@127.0.0.1:5432/controlplane_bench_failover"


def tool_env(run_dir: Path) -> dict[str, str]:
    """The gateway's downstream for the agents' MCP tool calls: the counting server, its ledger in ``run_dir``."""
    return {
        "MCP_DOWNSTREAMS": json.dumps([counting_downstream(run_dir / "tool-ledger.jsonl", timeout=5)]),
        "MCP_LOST_GRACE_SECONDS": "2",
    }


class Node:
    """The single-node baseline: the same server on the machine's own PostgreSQL."""

    def __init__(self, run_dir: Path):
        for sql in (
            "drop database if exists controlplane_bench_failover",
            "create database controlplane_bench_failover",
        ):
            subprocess.run(["psql", "-h", "127.0.0.1", "-U", "postgres", "-qc", sql], check=True)
        self.env = server_env(DATABASE_URL=SINGLE, TOKEN_CACHE_SECONDS="0", **tool_env(run_dir))
        self.manage("migrate", "--noinput")
        self.server = AppServer(run_dir, self.env).start()

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip()

    def token(self, name: str, role: str) -> str:
        return self.manage(
            "issue_token", "--role", role, "--name", name, "--pool", "v1" if role == "worker" else ""
        )


def seed(url: str, operator_token: str, namespace: str, count: int) -> None:
    with httpx.Client(
        base_url=url, timeout=60, headers={"Authorization": f"Bearer {operator_token}"}
    ) as http:
        assert ha.answered(http, "POST", "/api/v1/namespaces", json={"name": namespace}).status_code in (
            200,
            201,
        )

        def create(i: int) -> int:
            body = {
                "namespace": namespace,
                "node_id": "n",
                "input": {"i": i, "kind": {0: "effect", 2: "mcp"}.get(i % 4, "plain")},
            }
            return ha.answered(http, "POST", "/api/v1/tasks", json=body).status_code

        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(create, range(count))) == {201}


def run_workers(
    url: str, tokens: list[str], namespace: str, seconds: float, logs: Path, target: str
) -> list[Path]:
    paths = [logs / f"{namespace}-w{i}.jsonl" for i in range(len(tokens))]
    env = {**os.environ, "CHAOS_THINK_SECONDS": "0"}
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "tests/chaos/worker.py"),
                url,
                token,
                f"bench-w{i}",
                namespace,
                str(path),
                str(seconds),
                target,
            ],
            cwd=ROOT,
            env=env,
        )
        for i, (token, path) in enumerate(zip(tokens, paths, strict=True))
    ]
    return procs, paths


def throughput(
    url: str, tokens: list[str], operator: str, namespace: str, seconds: float, logs: Path, target: str
) -> float:
    seed(url, operator, namespace, int(80 * seconds))
    procs, paths = run_workers(url, tokens, namespace, seconds, logs, target)
    for proc in procs:
        proc.wait(seconds + 120)
    commits = [e for e in ha.history(paths) if e["op"] == "commit" and e["status"] == 200]
    return len(commits) / seconds


def failovers(
    cluster: ha.Cluster,
    tokens: list[str],
    operator: str,
    namespace: str,
    args,
    logs: Path,
    target: EffectTarget,
    *,
    partition: bool,
) -> dict:
    seed(cluster.servers[0].url, operator, namespace, int(60 * args.seconds))
    procs, paths = run_workers(cluster.servers[0].url, tokens, namespace, args.seconds, logs, target.url)
    kills: list[ha.Kill] = []
    gap = args.seconds / (args.failovers + 1)
    started = time.time()
    for n in range(args.failovers):
        time.sleep(max(0.0, started + gap * (n + 1) - time.time()))
        if partition:
            cluster.script("pause-replication")
            time.sleep(0.5)  # the leader acknowledges alone for half a second
        elif cluster.sync:
            cluster.wait_for_sync_standby()
        kill = cluster.kill_leader()
        kills.append(kill)
        print(
            f"  failover {n + 1}: {kill.leader} leads, {kill.promoted - kill.killed:.1f} s after the kill",
            flush=True,
        )
    for proc in procs:
        proc.wait(args.seconds + 120)
    entries = ha.history(paths)
    run = ha.judge(cluster, entries, kills, namespace=namespace)
    run["effect_keys_sent_twice"] = sum(1 for calls in target.calls.values() if len(calls) > 1)
    run |= ha.tool_calls(cluster, entries, kills, logs / "tool-ledger.jsonl", namespace=namespace)
    print(f"  {run}", flush=True)
    verdict = trace.replay([e for e in trace.recorded(cluster.sql) if e.namespace == namespace])
    run["trace_events"], run["trace_explained"], run["trace_seconds"] = (
        verdict.events,
        verdict.explained,
        round(verdict.seconds, 2),
    )
    return run


OUT = ROOT / "bench" / "results" / f"failover-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"


def save(results: dict) -> Path:
    """Written after each phase, so a run cut short keeps what it measured."""
    OUT.write_text(json.dumps(results, indent=2, default=str) + "\n")
    return OUT


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--failovers", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=600)
    parser.add_argument("--baseline-seconds", type=float, default=60)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="bench-failover-"))
    target = EffectTarget().start()
    results: dict = {"args": vars(args), "started": datetime.now(UTC).isoformat()}

    node = Node(logs)
    operator = node.token("bench-op", "operator")
    tokens = [node.token(f"bench-w{i}", "worker") for i in range(args.workers)]
    single = throughput(node.server.url, tokens, operator, "single", args.baseline_seconds, logs, target.url)
    node.server.stop()
    print(f"single node: {single:.1f} commits/s", flush=True)

    cluster = ha.Cluster(logs, sync=True).up()
    try:
        cluster.control_plane(TOKEN_CACHE_SECONDS="0", **tool_env(logs))
        operator = cluster.token("bench-op", "operator")
        tokens = [cluster.token(f"bench-w{i}", "worker") for i in range(args.workers)]
        sync = throughput(
            cluster.servers[0].url, tokens, operator, "sync-load", args.baseline_seconds, logs, target.url
        )
        print(f"synchronous cluster: {sync:.1f} commits/s", flush=True)
        cluster.script("sync", "off")
        asynchronous = throughput(
            cluster.servers[0].url, tokens, operator, "async-load", args.baseline_seconds, logs, target.url
        )
        print(f"asynchronous cluster: {asynchronous:.1f} commits/s", flush=True)
        results["throughput_commits_per_second"] = {
            "single": single,
            "synchronous": sync,
            "asynchronous": asynchronous,
        }
        results["synchronous_to_single"] = sync / single
        results["asynchronous_to_single"] = asynchronous / single

        cluster.script("sync", "on")
        cluster.sync = True
        print("synchronous failovers:", flush=True)
        save(results)
        results["synchronous"] = failovers(
            cluster, tokens, operator, "sync-failovers", args, logs, target, partition=False
        )
        cluster.script("sync", "off")
        cluster.sync = False
        print("asynchronous failovers, replication cut before each:", flush=True)
        save(results)
        results["asynchronous"] = failovers(
            cluster, tokens, operator, "async-failovers", args, logs, target, partition=True
        )
    finally:
        cluster.down()
        target.stop()
    results["finished"] = datetime.now(UTC).isoformat()
    out = save(results)
    s, a = results["synchronous"], results["asynchronous"]
    print("\n| | synchronous | asynchronous |\n|---|---|---|")
    for key in (
        "grants",
        "commits",
        "effect_outcomes",
        "lost_grants",
        "lost_commits",
        "lost_effect_outcomes",
        "generations_stored_twice",
        "live_holders_twice",
        "effect_keys_sent_twice",
        "mcp_calls_answered",
        "mcp_calls_lost",
        "mcp_calls_answered_after_last_failover",
        "mcp_keys_acted_on_twice",
        "stale_refused",
        "stale_refused_epoch",
        "failover_fences",
        "answered_500",
        "resume_seconds_p50",
        "resume_seconds_p99",
        "trace_events",
        "trace_explained",
    ):
        print(f"| {key} | {s[key]} | {a[key]} |")
    print(
        f"\nthroughput: single {single:.1f}/s, synchronous {sync:.1f}/s ({results['synchronous_to_single']:.2f}×), "
        f"asynchronous {asynchronous:.1f}/s ({results['asynchronous_to_single']:.2f}×)\nwritten to {out}"
    )


if __name__ == "__main__":
    main()
