"""The HA PostgreSQL cluster of ``scripts/ha-cluster.sh`` (Patroni, etcd, HAProxy, PgBouncer) for a test: its own
directory and ports, driven only through the script, as operators and outside checks drive it.

``Cluster.control_plane()`` migrates the control plane onto it, issues tokens, and starts a production server on
it (through HAProxy), so a test speaks to the service while the database below it fails over."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
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

    def kill_leader(self) -> str:
        """SIGKILL the leader; the new leader's name once Patroni has promoted one."""
        return self.script("kill-leader").splitlines()[-1].split("=", 1)[1]

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

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=ROOT, env=self.env(), capture_output=True, text=True
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


def answered(http: httpx.Client, method: str, path: str, *, seconds: float = 60, **kwargs) -> httpx.Response:
    """The first answer that is not a 503 (the switch under way): what a client that retries what the contract
    says it may retry ends with."""
    deadline = time.monotonic() + seconds
    while True:
        response = http.request(method, path, **kwargs)
        if response.status_code != 503 or time.monotonic() > deadline:
            return response
        time.sleep(float(response.headers.get("Retry-After", "1")) / 4)
