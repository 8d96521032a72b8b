"""A Jepsen-style run, CI-sized: real worker processes against a real server on PostgreSQL, every request and
answer recorded with timestamps, faults injected mid-run, then the invariants checked over the whole history
and the database:

- at most one canonical commit per task (history and rows);
- claim generations strictly increase per task, in the order the grants were answered;
- no accepted commit carries an older (epoch, generation) than one accepted before it on the same task;
- every committed result was computed on the input digest current at commit;
- progress: healthy owners do commit.

Faults (named scenarios): a worker paused with SIGSTOP past its lease and resumed; a worker killed with SIGKILL
mid-run; the server's database connections terminated from PostgreSQL's side (pg_terminate_backend); an epoch
fence and resume mid-run. CHAOS_SECONDS (default 8) sets the run's length; docs/chaos.md has longer runs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import httpx
import pytest
from django.db import connection

from claims.digest import digest
from claims.models import StagedResult, Task
from tests.conftest import ensure_default_namespace, make_actor

ROOT = Path(__file__).resolve().parents[2]
SECONDS = float(os.environ.get("CHAOS_SECONDS", "8"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server():
    db = connection.settings_dict
    port = _free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings.test",
        "DEBUG": "false",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "DATABASE_CONN_MAX_AGE": "60",
    }
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.get(url + "/api/v1/schema/", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    yield url
    proc.terminate()
    proc.wait(10)


def _history(paths: list[Path]) -> list[dict]:
    entries = []
    for path in paths:
        if path.exists():
            entries += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(entries, key=lambda e: e["t1"])


def check_invariants(
    logs: list[Path], *, revised_task: str | None = None, min_commits: int = 10
) -> list[dict]:
    """The invariants over the recorded history and the rows; returns the history."""
    history = _history(logs)
    assert len(history) > 50, f"only {len(history)} operations recorded"

    # 1. at most one canonical commit per task — in the history and in the rows
    committed = defaultdict(set)
    for e in history:
        if e["op"] == "commit" and e["status"] == 200:
            committed[e["task_id"]].add(e["attempt_id"])
    assert all(len(attempts) == 1 for attempts in committed.values()), committed
    for task_id in committed:
        assert StagedResult.objects.filter(task_id=task_id, canonical=True).count() == 1

    # 2. generations strictly increase per task, in the order the grants were answered
    grants = defaultdict(list)
    for e in history:
        if e["op"] == "claim" and e["status"] == 200:
            grants[e["task_id"]].append((e["t1"], e["generation"]))
    for task_id, seen in grants.items():
        generations = [g for _, g in sorted(seen)]
        assert generations == sorted(set(generations)), (task_id, generations)

    # 3. no accepted commit older (epoch, generation) than one accepted before it on the same task
    accepted = defaultdict(list)
    for e in history:
        if e["op"] == "commit" and e["status"] == 200:
            accepted[e["task_id"]].append((e["epoch"], e["generation"]))
    assert all(seq == sorted(seq) for seq in accepted.values())

    # 4. every committed result was computed on the input digest current at commit
    for task in Task.objects.filter(namespace__name="chaos", state="COMMITTED"):
        assert task.result["computed_on"] == task.input_digest, task.task_id
    if revised_task:
        revised = Task.objects.get(pk=revised_task)
        assert revised.state != "COMMITTED" or revised.result["computed_on"] == digest({"i": "revised"})

    # 5. progress: healthy owners commit
    # nothing acknowledged is lost: every 200 COMMITTED is the task's canonical commit in the rows
    for task_id, attempts in committed.items():
        row = Task.objects.get(pk=task_id)
        assert row.state == "COMMITTED" and str(row.attempt_id) in attempts, task_id
    assert len(committed) >= min_commits, f"only {len(committed)} commits in {SECONDS}s"
    return history


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_invariants_hold_over_a_history_with_pauses_kills_terminated_connections_and_a_fence(
    server, tmp_path
):
    ensure_default_namespace()
    operator, oncall = make_actor("chaos-op", "operator"), make_actor("chaos-oncall", "oncall")
    operator.post("/namespaces", {"name": "chaos"})
    tasks = [
        operator.create(namespace="chaos", node_id="n", input={"i": i}).json()["task_id"] for i in range(150)
    ]
    workers = [make_actor(f"chaos-w{i}", "worker") for i in range(4)]
    logs = [tmp_path / f"{w.name}.jsonl" for w in workers]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "tests" / "chaos" / "worker.py"),
                server,
                w.token,
                w.name,
                "chaos",
                str(log),
                str(SECONDS),
            ],
            cwd=ROOT,
        )
        for w, log in zip(workers, logs, strict=True)
    ]
    faults: list[str] = []
    time.sleep(SECONDS * 0.15)
    os.kill(procs[0].pid, signal.SIGSTOP)  # paused past its 2-second lease
    faults.append("SIGSTOP chaos-w0 for 3 s")
    time.sleep(SECONDS * 0.15)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        faults.append(f"pg_terminate_backend on {cursor.fetchone()[0]} server connections")
    time.sleep(3 - SECONDS * 0.15 if SECONDS * 0.15 < 3 else 0.1)
    os.kill(procs[0].pid, signal.SIGCONT)
    faults.append("SIGCONT chaos-w0")
    # A revised input mid-run: commits computed on the old input must be refused.
    operator.post(f"/tasks/{tasks[-1]}/input", {"input": {"i": "revised"}})
    time.sleep(SECONDS * 0.1)
    os.kill(procs[1].pid, signal.SIGKILL)  # killed mid-run, wherever it was
    faults.append("SIGKILL chaos-w1")
    oncall.post("/namespaces/chaos/fence", {"reason": "chaos"})
    time.sleep(0.3)
    oncall.post("/namespaces/chaos/resume", {})
    faults.append("epoch fence + resume")
    for proc in procs[2:] + procs[:1]:
        proc.wait(SECONDS + 30)

    history = check_invariants(logs, revised_task=tasks[-1])
    outcomes = defaultdict(int)
    for e in history:
        outcomes[f"{e['op']}:{e['outcome']}"] += 1
    print(f"\nCHAOS {len(history)} operations, faults: {faults}\noutcomes: {dict(outcomes)}")


def _pg_restart() -> None:
    version = sorted(os.listdir("/etc/postgresql"))[0]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart", "-m", "fast"],
        check=True,
        capture_output=True,
    )
    for _ in range(60):
        if subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432"]).returncode == 0:
            return
        time.sleep(0.5)
    raise AssertionError("PostgreSQL did not come back")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_nothing_acknowledged_is_lost_when_postgres_restarts_under_load(server, tmp_path):
    if not os.path.isdir("/etc/postgresql") or os.geteuid() != 0:
        pytest.skip("restarting PostgreSQL needs root and a Debian cluster (CI has both)")
    ensure_default_namespace()
    operator = make_actor("chaos-op", "operator")
    operator.post("/namespaces", {"name": "chaos"})
    for i in range(150):
        operator.create(namespace="chaos", node_id="n", input={"i": i})
    workers = [make_actor(f"chaos-w{i}", "worker") for i in range(3)]
    logs = [tmp_path / f"{w.name}.jsonl" for w in workers]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "tests" / "chaos" / "worker.py"),
                server,
                w.token,
                w.name,
                "chaos",
                str(log),
                str(SECONDS),
            ],
            cwd=ROOT,
        )
        for w, log in zip(workers, logs, strict=True)
    ]
    time.sleep(SECONDS * 0.3)
    _pg_restart()
    connection.close()  # this test's own session died with the server; reconnect for the checks
    for proc in procs:
        proc.wait(SECONDS + 30)

    history = check_invariants(logs, min_commits=5)
    failed = [e for e in history if e["outcome"] in ("ERROR", "UNAVAILABLE") or e["status"] >= 500]
    errors = len(failed)
    assert all(e["status"] in (0, 503) for e in failed), [
        e["status"] for e in failed
    ]  # 503 or no answer, never 500
    print(
        f"\nRESTART {len(history)} operations, {errors} failed during the restart, all acknowledged commits kept"
    )
