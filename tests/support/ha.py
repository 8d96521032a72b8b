"""The HA PostgreSQL cluster of ``scripts/ha-cluster.sh`` (Patroni, etcd, HAProxy, PgBouncer) for a test: its own
directory and ports, driven only through the script, as operators and outside checks drive it.

``Cluster.control_plane()`` migrates the control plane onto it, issues tokens, and starts a production server on
it (through HAProxy), so a test speaks to the service while the database below it fails over."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg

from deploy.topology import AppServer
from tests.support.processes import server_env

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ha-cluster.sh"


def can_run() -> bool:
    """The script installs Patroni and etcd from Debian and runs PostgreSQL as the postgres user: root and a
    Debian PostgreSQL (CI has both)."""
    return os.geteuid() == 0 and os.path.isdir("/usr/lib/postgresql") and shutil.which("apt-get") is not None


@dataclass
class Kill:
    killed: float  # when the leader's postmaster was SIGKILLed (wall clock)
    promoted: float  # when Patroni had promoted another (as the script saw it)
    leader: str  # the new leader


@dataclass
class Cluster:
    run_dir: Path
    sync: bool = True
    base_port: int = 5540
    rest_base: int = 8500
    etcd_port: int = 23890
    url: str = ""
    servers: list[AppServer] = field(default_factory=list)
    # PostgreSQL runs as the postgres user, who cannot enter pytest's root-only temporary directories.
    cluster_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="claim-ha-")) / "cluster")

    def script(self, *args: str, timeout: float = 240) -> str:
        env = {
            **os.environ,
            "HA_DIR": str(self.cluster_dir),
            "HA_BASE_PORT": str(self.base_port),
            "HA_REST_BASE": str(self.rest_base),
            "HA_ETCD_PORT": str(self.etcd_port),
            "HA_SYNC": "on" if self.sync else "off",
        }
        done = subprocess.run(
            ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=timeout
        )
        if done.returncode != 0:
            raise RuntimeError(f"ha-cluster.sh {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout.strip()

    def up(self) -> Cluster:
        self.cluster_dir.parent.chmod(0o755)
        self.script("down")
        last = self.script("up").splitlines()[-1]
        assert last.startswith("DATABASE_URL="), last
        self.url = last.split("=", 1)[1]
        return self

    def down(self) -> None:
        for server in self.servers:
            server.stop()
        self.script("down")
        shutil.rmtree(self.cluster_dir.parent, ignore_errors=True)

    def leader(self) -> str:
        return self.script("status").splitlines()[0].split("=", 1)[1]

    def kill_leader(self) -> Kill:
        """SIGKILL the leader; when it died, and the new leader once Patroni has promoted one."""
        lines = dict(line.split("=", 1) for line in self.script("kill-leader").splitlines() if "=" in line)
        return Kill(float(lines["killed_at"]), time.time(), lines["leader"])

    def wait_for_sync_standby(self, seconds: float = 60) -> None:
        deadline = time.monotonic() + seconds
        while "role=sync_standby" not in self.script("status"):
            assert time.monotonic() < deadline, self.script("status")
            time.sleep(0.5)

    def sql(self, query: str, params: tuple = ()) -> list[tuple]:
        """A query on the leader (through HAProxy), retried while the switch is under way."""
        deadline = time.monotonic() + 60
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=3, autocommit=True) as conn:
                    return conn.execute(query, params).fetchall()
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def env(self, **extra: str) -> dict[str, str]:
        return server_env(DATABASE_URL=self.url, **extra)

    def manage(self, *args: str, **env: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=ROOT,
            env=self.env(**env),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {' '.join(args)}: {done.stdout}{done.stderr}")
        return done.stdout.strip()

    def control_plane(self, **env: str) -> AppServer:
        """The control plane migrated onto the cluster and a production server on it."""
        self.manage("migrate", "--noinput")
        server = AppServer(self.run_dir, self.env(**env)).start()
        self.servers.append(server)
        return server

    def token(self, name: str, role: str) -> str:
        return self.manage(
            "issue_token", "--role", role, "--name", name, "--pool", "v1" if role == "worker" else ""
        )


def history(logs: list[Path]) -> list[dict]:
    """The chaos workers' recorded requests and answers (tests/chaos/worker.py), in the order they were answered."""
    entries = [
        json.loads(line) for log in logs if log.exists() for line in log.read_text().splitlines() if line
    ]
    return sorted(entries, key=lambda e: e["t1"])


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def judge(cluster: Cluster, entries: list[dict], kills: list[Kill], *, namespace: str) -> dict:
    """What a failover run did, judged against the leader's rows at the end: the acknowledged decisions the
    database no longer has, the stale tokens refused, what was issued twice, and how soon each worker claimed again
    after each failover."""
    grants = [e for e in entries if e["op"] == "claim" and e["status"] == 200]
    commits = [e for e in entries if e["op"] == "commit" and e["status"] == 200]
    outcomes = [e for e in entries if e["op"] == "effect" and e["status"] == 200]
    stored = {row[0] for row in cluster.sql("select attempt_id::text from claims_attempt")}
    committed = dict(
        cluster.sql("select task_id, attempt_id::text from claims_task where state = 'COMMITTED'")
    )
    effects = dict(cluster.sql("select effect_id, state from claims_effect"))
    resumes = []
    for kill in kills:
        for owner in {e["owner"] for e in entries}:
            after = [e["t1"] for e in grants if e["owner"] == owner and e["t0"] > kill.killed]
            resumes.append(min(after) - kill.killed if after else float("inf"))
    generations = defaultdict(list)
    for e in grants:
        generations[e["task_id"]].append(e["generation"])
    return {
        "operations": len(entries),
        "grants": len(grants),
        "commits": len(commits),
        "effect_outcomes": len(outcomes),
        "lost_grants": sum(1 for e in grants if e["attempt_id"] not in stored),
        "lost_commits": sum(1 for e in commits if committed.get(e["task_id"]) != e["attempt_id"]),
        "lost_effect_outcomes": sum(1 for e in outcomes if effects.get(e["effect_id"]) != e["outcome"]),
        "generations_answered_twice": sum(len(seq) - len(set(seq)) for seq in generations.values()),
        "generations_stored_twice": len(
            cluster.sql(
                "select task_id, claim_generation from claims_attempt group by 1, 2 having count(*) > 1"
            )
        ),
        "canonical_commits_twice": len(
            cluster.sql(
                "select task_id from claims_stagedresult where canonical group by 1 having count(*) > 1"
            )
        ),
        "live_holders_twice": len(
            cluster.sql(
                "select task_id from claims_attempt where ended_at is null group by 1 having count(*) > 1"
            )
        ),
        "stale_refused": sum(1 for e in entries if e.get("outcome") == "FENCED"),
        "stale_refused_epoch": sum(
            1 for e in entries if e.get("outcome") == "FENCED" and e.get("reason") == "EPOCH"
        ),
        "answered_500": sum(1 for e in entries if e["status"] >= 500 and e["status"] != 503),
        "answered_503_or_nothing": sum(1 for e in entries if e["status"] in (0, 503)),
        "failover_fences": cluster.sql(
            "select count(*) from claims_auditentry where action = 'failover_fence' and namespace = %s",
            (namespace,),
        )[0][0],
        "promoted_seconds": [round(k.promoted - k.killed, 2) for k in kills],
        "resume_seconds_p50": percentile(resumes, 0.5),
        "resume_seconds_p99": percentile(resumes, 0.99),
        "workers_not_resumed": sum(1 for r in resumes if r == float("inf")),
    }


def answered(http: httpx.Client, method: str, path: str, *, seconds: float = 60, **kwargs) -> httpx.Response:
    """The first answer that is not a 503 (the switch under way): what a client that retries what the contract
    says it may retry ends with."""
    deadline = time.monotonic() + seconds
    while True:
        response = http.request(method, path, **kwargs)
        if response.status_code != 503 or time.monotonic() > deadline:
            return response
        time.sleep(float(response.headers.get("Retry-After", "1")) / 4)


def tool_calls(
    cluster: Cluster, entries: list[dict], kills: list[Kill], ledger: Path, *, namespace: str
) -> dict:
    """The run's MCP tool calls (tests/chaos/worker.py ``tool_call``), judged against the leader's rows and the
    downstream's ledger (tests/gateway/counting_server.py): every call the tool answered has its effect COMMITTED,
    the downstream acted at most once per idempotency key, and calls were answered after the last failover (the
    gateway, in the same server process, connected again by itself)."""
    answered = [e for e in entries if e["op"] == "mcp" and e["status"] == 200]
    states = dict(
        cluster.sql(
            "select e.task_id, e.state from claims_effect e join claims_task t on t.task_id = e.task_id "
            "join claims_namespace n on n.id = t.namespace_id where n.name = %s and e.effect_slot like 'mcp:%%'",
            (namespace,),
        )
    )
    acted: dict[str, int] = {}
    for line in ledger.read_text().splitlines() if ledger.exists() else []:
        key = json.loads(line).get("key") or "?"
        acted[key] = acted.get(key, 0) + 1
    last_kill = max((k.killed for k in kills), default=0.0)
    return {
        "mcp_calls_answered": len(answered),
        "mcp_calls_lost": sum(1 for e in answered if states.get(e["task_id"]) != "COMMITTED"),
        "mcp_calls_answered_after_last_failover": sum(1 for e in answered if e["t0"] > last_kill),
        "mcp_keys_acted_on_twice": sum(1 for n in acted.values() if n > 1),
    }
