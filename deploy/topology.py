"""A production topology on one machine, from Debian's own packages: PgBouncer (transaction mode) in front of
PostgreSQL, N app servers (gunicorn, deploy/gunicorn.conf.py) behind haproxy, M Celery workers and one beat.

    python -m deploy.topology up --database postgres://postgres@127.0.0.1:5432/controlplane \\
        --broker redis://127.0.0.1:6379/0 --servers 2 --workers 2

starts everything in a run directory (configs, logs, pid files), prints the load balancer's URL and waits; Ctrl-C
stops it all. The topology test (tests/deploy/test_topology.py) drives the same classes: it kills and restarts app
servers, restarts PgBouncer and kills Celery workers under a worker fleet. Needs ``apt-get install pgbouncer
haproxy`` (scripts/install-topology.sh). Every process writes to a file in the run directory, never to a pipe.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_port(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as s:
            s.settimeout(0.5)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return True
        time.sleep(0.05)
    return False


class Process:
    """One command in its own session (so a kill reaches its children), output appended to ``log_path``."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], run_dir: Path, *, cwd: Path = ROOT):
        self.name, self.args, self.env, self.cwd = name, args, env, cwd
        self.log_path = run_dir / f"{name}.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> Process:
        log = open(self.log_path, "a")  # noqa: SIM115 - the process keeps it
        self.proc = subprocess.Popen(
            self.args,
            cwd=self.cwd,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.proc is not None
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """SIGKILL the process and its children: a crash, not a shutdown."""
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)

    def stop(self, timeout: float = 30.0) -> None:
        if not self.alive():
            return
        assert self.proc is not None
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class AppServer(Process):
    """gunicorn with the project's config on its own port; ready once ``/healthz`` answers."""

    def __init__(
        self,
        run_dir: Path,
        env: dict[str, str],
        *,
        port: int = 0,
        processes: int = 1,
        asgi: bool = True,
        python: str = sys.executable,
    ):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [python, "-m", "gunicorn", "-c", str(ROOT / "deploy/gunicorn.conf.py")]
        if not asgi:
            args += ["--worker-class", "gthread", "--threads", "8"]
        args.append("controlplane.asgi:application" if asgi else "controlplane.wsgi:application")
        env = {**env, "BIND": f"127.0.0.1:{self.port}", "WEB_CONCURRENCY": str(processes)}
        super().__init__(f"server-{self.port}", args, env, run_dir)

    def start(self, timeout: float = 30.0) -> AppServer:
        import httpx

        super().start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise RuntimeError(f"{self.name} exited: {self.log()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not answer /healthz in {timeout} s: {self.log()[-2000:]}")

    def worker_pids(self) -> list[int]:
        assert self.proc is not None
        return [int(pid) for pid in subprocess.check_output(["pgrep", "-P", str(self.proc.pid)]).split()]


class PgBouncer(Process):
    """Debian's pgbouncer in transaction mode on its own port, in front of the PostgreSQL of ``upstream`` (a
    postgres:// URL). ``url_for(database_url)`` is that URL through the pooler."""

    def __init__(self, run_dir: Path, upstream: str, *, port: int = 0, pool_size: int = 20):
        binary = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
        self.port = port or free_port()
        if (
            os.geteuid() == 0
        ):  # pgbouncer refuses to run as root: it runs as postgres, who must reach its files
            self.dir = Path(tempfile.mkdtemp(prefix=f"pgbouncer-{self.port}-"))
        else:
            self.dir = run_dir / f"pgbouncer-{self.port}"
            self.dir.mkdir(parents=True, exist_ok=True)
        parts = urlsplit(upstream)
        users = {parts.username or "postgres", "postgres", "root"}
        (self.dir / "userlist.txt").write_text("".join(f'"{user}" ""\n' for user in sorted(users)))
        (self.dir / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={parts.hostname or '127.0.0.1'} port={parts.port or 5432}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.dir / 'userlist.txt'}\n"
            f"pool_mode = transaction\ndefault_pool_size = {pool_size}\nmax_client_conn = 1000\n"
            "ignore_startup_parameters = extra_float_digits,options,application_name\n"
            f"pidfile = {self.dir / 'pgbouncer.pid'}\nlogfile = {self.dir / 'pgbouncer.log'}\n"
            "server_reset_query =\nserver_check_delay = 1\n"
        )
        args = [binary]
        if os.geteuid() == 0:
            os.chmod(self.dir, 0o777)
            for path in self.dir.iterdir():
                os.chmod(path, 0o666)
            args += ["-u", "postgres"]
        super().__init__(
            f"pgbouncer-{self.port}", [*args, str(self.dir / "pgbouncer.ini")], dict(os.environ), run_dir
        )

    def start(self, timeout: float = 15.0) -> PgBouncer:
        super().start()
        if not _wait_port(self.port, timeout):
            raise RuntimeError(f"pgbouncer did not listen on {self.port}: {self.log()}")
        return self

    def url_for(self, database_url: str) -> str:
        parts = urlsplit(database_url)
        netloc = f"{parts.username + '@' if parts.username else ''}127.0.0.1:{self.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    def restart(self) -> None:
        self.stop(10)
        self.start()


class HAProxy(Process):
    """Debian's haproxy in front of the app servers, on its own port: round robin, each backend checked on
    ``/readyz`` every half second (out after two failures, back after one success). A request whose connection to
    a backend could not be made is sent to another; a request already sent is never sent again (a commit or a
    claim that reached a dying server is answered 502, and the worker asks again under its own attempt)."""

    def __init__(self, run_dir: Path, backends: list[AppServer], *, port: int = 0):
        binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        servers = "".join(
            f"    server app{i} 127.0.0.1:{b.port} check inter 500 fall 2 rise 1\n"
            for i, b in enumerate(backends)
        )
        config = run_dir / f"haproxy-{self.port}.cfg"
        config.write_text(
            "global\n    maxconn 4096\n"
            "defaults\n    mode http\n    timeout connect 2s\n    timeout client 65s\n    timeout server 65s\n"
            "    retries 3\n    option redispatch\n    retry-on conn-failure\n"
            f"frontend api\n    bind 127.0.0.1:{self.port}\n    default_backend app\n"
            "backend app\n    balance roundrobin\n    option httpchk GET /readyz\n    http-check expect status 200\n"
            + servers
        )
        super().__init__(
            f"haproxy-{self.port}", [binary, "-db", "-f", str(config)], dict(os.environ), run_dir
        )

    def start(self, timeout: float = 15.0) -> HAProxy:
        super().start()
        if not _wait_port(self.port, timeout):
            raise RuntimeError(f"haproxy did not listen on {self.port}: {self.log()}")
        return self


def celery(
    run_dir: Path, env: dict[str, str], name: str, *, beat: bool = False, python: str = sys.executable
) -> Process:
    """A Celery worker process (``beat``: the one beat, as its own process with no worker)."""
    if beat:
        args = ["beat", "--schedule", str(run_dir / "celerybeat-schedule"), "--loglevel", "INFO"]
    else:
        args = ["worker", "--pool", "solo", "--loglevel", "INFO", "--hostname", f"{name}@%h"]
        args += ["--without-gossip", "--without-mingle"]
    return Process(name, [python, "-m", "celery", "-A", "controlplane", *args], env, run_dir)


def up(args: argparse.Namespace) -> None:
    run_dir = Path(args.run_dir).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    bouncer = PgBouncer(run_dir, args.database, port=args.pgbouncer_port).start()
    env = {
        **os.environ,
        "DATABASE_URL": bouncer.url_for(args.database),
        "DATABASE_PGBOUNCER": "true",
        "DATABASE_LISTEN_URL": args.database,
        "CELERY_BROKER_URL": args.broker,
    }
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    servers = [AppServer(run_dir, env).start() for _ in range(args.servers)]
    balancer = HAProxy(run_dir, servers, port=args.port).start()
    jobs = [celery(run_dir, env, f"worker{i}").start() for i in range(args.workers)]
    jobs.append(celery(run_dir, env, "beat", beat=True).start())
    print(
        f"load balancer: {balancer.url}  (servers: {', '.join(s.url for s in servers)}; pgbouncer :{bouncer.port})"
    )
    print(f"logs and configs: {run_dir}  — Ctrl-C stops everything")
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    finally:
        for process in [balancer, *servers, *jobs, bouncer]:
            process.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("up", help="start the topology and wait")
    start.add_argument("--database", required=True, help="postgres:// URL of PostgreSQL itself")
    start.add_argument("--broker", required=True, help="redis:// or amqp:// URL")
    start.add_argument("--servers", type=int, default=2)
    start.add_argument("--workers", type=int, default=2)
    start.add_argument("--port", type=int, default=8080, help="the load balancer's port")
    start.add_argument("--pgbouncer-port", type=int, default=6432)
    start.add_argument("--run-dir", default=str(ROOT / "var/topology"))
    args = parser.parse_args()
    up(args)


if __name__ == "__main__":
    main()
