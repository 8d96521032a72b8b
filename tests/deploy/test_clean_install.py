"""The built wheel, installed alone into a clean venv in a folder outside the checkout, runs everything an operator
runs, with the one command it installs (``claimctl``): the README's worked session against ``claimctl run`` (the
embedded default: SQLite and its file broker, supervised, stopped by one SIGTERM with nothing left running) and
against the production profile on PostgreSQL — ``claimctl migrate``, ``check``, ``serve`` (gunicorn + uvicorn,
ready on /readyz with the package's version) and ``worker`` running a job on Redis and on RabbitMQ. The embedded
default runs on each Python the project allows that this machine has (3.11, and pyenv's 3.12 and 3.13 when present);
the production profile, the same code on other services, on the project's own Python (issue 37: the suite's time). Before issue 25
``pip install .`` installed no code at all (the package list was empty): it ran only from the checkout."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

import controlplane
from deploy.topology import Process, free_port
from tests.deploy.test_readme_session import session
from tests.support.processes import _redis_broker, wait_for

ROOT = Path(__file__).resolve().parents[2]
RABBITMQ_URL = os.environ.get("RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _pythons() -> list[str]:
    found = {f"{sys.version_info.major}.{sys.version_info.minor}": sys.executable}
    for minor in ("3.12", "3.13"):
        for candidate in sorted(Path("/root/.pyenv/versions").glob(f"{minor}.*"), reverse=True):
            if (candidate / "bin/python3").exists():
                found.setdefault(minor, str(candidate / "bin/python3"))
                break
    return [found[v] for v in sorted(found)]


def _listening(url: str) -> bool:
    parts = urlsplit(url)
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((parts.hostname or "127.0.0.1", parts.port or 5672)) == 0


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy of the checkout: setuptools writes build/ and the egg-info into the tree it builds, and
    # another build of the checkout at the same time (another test process, a developer's) would pull them away.
    source = tmp_path_factory.mktemp("source") / "claim-control-plane"
    ignored = (
        ".git",
        ".venv",
        "build",
        "*.egg-info",
        "node_modules",
        "var",
        "__pycache__",
        ".*_cache",
        ".hypothesis",
    )
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*ignored))
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (found,) = out.glob("claim_control_plane-*.whl")
    assert found.name.startswith(f"claim_control_plane-{controlplane.__version__}-")
    return found


def _venv_with(python: str, venv: Path, wheel: Path) -> subprocess.CompletedProcess[str]:
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin"
    return subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "--quiet", str(wheel)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def clean_venvs(tmp_path_factory, wheel) -> dict[str, Path]:
    """A clean venv per Python with the wheel alone installed, made side by side (pip waits on the network and
    the disk as much as on the CPU)."""
    pythons = _pythons()
    venvs = {python: tmp_path_factory.mktemp("venv") for python in pythons}
    with ThreadPoolExecutor(max_workers=len(pythons)) as pool:
        done = list(pool.map(lambda python: _venv_with(python, venvs[python], wheel), pythons))
    for python, installed in zip(pythons, done, strict=True):
        assert installed.returncode == 0, (python, installed.stderr[-3000:])
    return venvs


@pytest.fixture(scope="module", params=_pythons(), ids=lambda p: Path(p).parent.parent.name)
def clean_venv(request, clean_venvs) -> Path:
    return clean_venvs[request.param]


@pytest.fixture
def elsewhere(tmp_path) -> Path:
    """A working folder outside the checkout: nothing of the repository is importable from it."""
    site = tmp_path / "site"
    site.mkdir()
    return site


@pytest.fixture
def postgres_database() -> Iterator[str]:
    """A PostgreSQL database of its own on the server DATABASE_URL names (CI's), dropped afterwards."""
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        pytest.skip("needs DATABASE_URL=postgres://… (.ci/run sets one)")
    import psycopg

    parts = urlsplit(url)
    name = f"clean_install_{uuid.uuid4().hex[:8]}"
    admin = parts._replace(path="/postgres").geturl()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield parts._replace(path=f"/{name}").geturl()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _env(venv: Path, **settings: str) -> dict[str, str]:
    """Only the clean venv on PATH, and the settings given: no checkout on any path."""
    return {
        "PATH": f"{venv / 'bin'}:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "SECRET_KEY": "clean-install-" + "k" * 40 + "abcdefgh",
        **settings,
    }


def _claimctl(venv: Path, env: dict[str, str], cwd: Path, *args: str) -> str:
    done = subprocess.run(
        [str(venv / "bin/claimctl"), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done.stdout


def _ready(url: str, process: Process, timeout: float = 60) -> dict:
    def answers() -> bool:
        assert process.alive(), process.log()[-3000:]
        try:
            return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    assert wait_for(answers, timeout), process.log()[-3000:]
    return httpx.get(f"{url}/readyz", timeout=5).json()


def _run_session(venv: Path, env: dict[str, str], cwd: Path, url: str) -> str:
    done = subprocess.run(
        ["bash", "-eu", "-c", session()],
        cwd=cwd,
        env={**env, "S": f"{url}/api/v1", "CLAIMCTL": str(venv / "bin/claimctl")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert '"outcome":"FENCED"' in done.stdout.replace(" ", "")
    return done.stdout


def _run_the_example_worker(venv: Path, env: dict[str, str], cwd: Path, url: str) -> None:
    """Issue 37: the README's example worker (docs/example_worker.py) failed after `make run` with
    ModuleNotFoundError: claim_client. With the server's package alone installed it finishes a task."""
    worker = _claimctl(venv, env, cwd, "issue-token", "--role", "worker", "--name", "worker-ex").split()[-1]
    operator = _claimctl(venv, env, cwd, "issue-token", "--role", "operator", "--name", "op-ex").split()[-1]
    task = httpx.post(
        f"{url}/api/v1/tasks",
        json={"node_id": "example", "input": {"n": 1}},
        headers={"Authorization": f"Bearer {operator}"},
        timeout=10,
    ).json()["task_id"]
    done = subprocess.run(
        [str(venv / "bin/python"), str(ROOT / "docs/example_worker.py"), "--url", url, "--token", worker,
         "--owner", "worker-ex", "--once"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    answer = httpx.get(
        f"{url}/api/v1/tasks/{task}", headers={"Authorization": f"Bearer {operator}"}, timeout=10
    )
    assert answer.json()["state"] == "COMMITTED", answer.json()


def _descendants(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        child, parent = map(int, line.split())
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _running(pids: set[int]) -> set[int]:
    alive = set()
    for pid in pids:
        try:
            os.kill(pid, 0)
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
            if state != "Z":
                alive.add(pid)
        except (ProcessLookupError, FileNotFoundError):
            pass
    return alive


@pytest.mark.timeout(900)
def test_the_wheel_runs_the_worked_session_on_the_embedded_default_and_stops_on_one_signal(
    clean_venv, elsewhere, tmp_path
):
    env = _env(clean_venv, CONTROLPLANE_VAR_DIR=str(elsewhere / "var"), PORT=str(free_port()))
    assert (
        _claimctl(clean_venv, env, elsewhere, "--version").strip() == f"claimctl {controlplane.__version__}"
    )
    refused = subprocess.run(
        [str(clean_venv / "bin/claimctl"), "serve"], cwd=elsewhere, env=env, capture_output=True, text=True
    )
    assert refused.returncode == 2 and "needs PostgreSQL and a real broker" in refused.stderr

    run = Process(
        "claimctl-run", [str(clean_venv / "bin/claimctl"), "run"], env, tmp_path, cwd=elsewhere
    ).start()
    url = f"http://127.0.0.1:{env['PORT']}"
    try:
        ready = _ready(url, run)
        assert ready["version"] == controlplane.__version__
        _run_session(clean_venv, env, elsewhere, url)
        _run_the_example_worker(clean_venv, env, elsewhere, url)
        assert run.proc is not None
        family = _descendants(run.proc.pid)
        assert len(family) >= 3  # the server, the worker and beat (each its own process)
    finally:
        started = time.monotonic()
        run.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        run.proc.wait(60)  # type: ignore[union-attr]
    took = time.monotonic() - started
    assert took < 45 and run.proc.returncode == 0, run.log()[-3000:]  # type: ignore[union-attr]
    assert wait_for(lambda: not _running(family), 10), (_running(family), run.log()[-3000:])
    lines = [line for line in run.log().splitlines() if line.startswith("claimctl run:")]
    assert sorted(line.split()[2] for line in lines) == ["beat", "web", "worker"], run.log()[-3000:]
    assert all(" stopped (" in line for line in lines), lines  # none needed SIGKILL
    assert len(lines) == 3 and "Traceback" not in run.log(), run.log()[-3000:]
    assert (elsewhere / "var/controlplane.sqlite3").exists()  # the embedded default's files, where it ran


@pytest.mark.timeout(900)
@pytest.mark.parametrize("clean_venv", [sys.executable], indirect=True, ids=["project-python"])
def test_the_wheel_runs_the_production_profile_on_postgresql_with_jobs_on_redis_and_rabbitmq(
    clean_venv, postgres_database, elsewhere, tmp_path
):
    redis_url = _redis_broker()
    if redis_url is None:
        pytest.skip("needs a reachable Redis in CELERY_BROKER_URL (redis://…); .ci/run sets one")
    if not _listening(RABBITMQ_URL):
        pytest.skip(f"needs RabbitMQ at {RABBITMQ_URL} (.ci/run starts it)")
    python = str(clean_venv / "bin/python")
    listed = subprocess.run([python, "-m", "pip", "list"], capture_output=True, text=True, check=True).stdout
    installed = {line.split()[0].lower() for line in listed.splitlines()[2:]}
    assert not installed & {
        "pytest",
        "ruff",
        "mypy",
        "playwright",
    }  # no dev tool came along to pull anything in

    port = free_port()
    base = _env(
        clean_venv, DATABASE_URL=postgres_database, CELERY_BROKER_URL=redis_url, BIND=f"127.0.0.1:{port}",
        WEB_CONCURRENCY="1", CONTROLPLANE_VAR_DIR=str(elsewhere / "var"),
    )  # fmt: skip
    _claimctl(clean_venv, base, elsewhere, "migrate", "--no-input", "-v", "0")
    _claimctl(clean_venv, base, elsewhere, "check", "--fail-level", "ERROR")

    server = Process(
        "claimctl-serve", [str(clean_venv / "bin/claimctl"), "serve"], base, tmp_path, cwd=elsewhere
    )
    server.start()
    try:
        url = f"http://127.0.0.1:{port}"
        assert _ready(url, server)["version"] == controlplane.__version__
        _run_session(clean_venv, base, elsewhere, url)
    finally:
        server.stop()

    for name, broker in (("redis", redis_url), ("rabbitmq", RABBITMQ_URL)):
        env = {**base, "CELERY_BROKER_URL": broker}
        worker = Process(
            f"worker-{name}",
            [str(clean_venv / "bin/claimctl"), "worker", "--pool", "solo", "--hostname", f"clean-{name}@%h"],
            env,
            tmp_path,
            cwd=elsewhere,
        ).start()
        try:
            assert wait_for(lambda w=worker: "ready." in w.log() or not w.alive(), 60), worker.log()[-3000:]
            assert worker.alive(), worker.log()[-3000:]
            sent = _claimctl(
                clean_venv, env, elsewhere, "manage", "shell", "-c",
                "from claims.tasks import reap_expired_leases; print(reap_expired_leases.delay().id)",
            )  # fmt: skip
            job = sent.strip().splitlines()[-1]
            done_line = re.compile(rf"Task claims\.reap_expired_leases\[{job}\] succeeded")
            assert wait_for(lambda w=worker, d=done_line: bool(d.search(w.log())), 60), worker.log()[-3000:]
        finally:
            worker.stop()
