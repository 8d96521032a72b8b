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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from django.db import connection

from claims.digest import digest
from claims.models import DispatchIntent, Effect, EffectEvent, Namespace, Principal, StagedResult, Task
from claims.tasks import redeliver_dispatches
from rollout import fences
from rollout.models import DrainSnapshot, FenceRequest, Rollback
from rollout.tasks import advance_rollback, fence_epoch, resend_fences
from tests.conftest import ensure_default_namespace, make_actor, row_locked, wait_for

ROOT = Path(__file__).resolve().parents[2]
SECONDS = float(os.environ.get("CHAOS_SECONDS", "8"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(**extra_env: str) -> Iterator[str]:
    """``manage.py runserver`` in its own process on the test database; yields its URL."""
    db = connection.settings_dict
    port = _free_port()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings.test",
        "DEBUG": "false",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}",
        "DATABASE_CONN_MAX_AGE": "60",
        **extra_env,
    }
    proc = subprocess.Popen(
        [sys.executable, "manage.py", "runserver", "--noreload", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.get(url + "/api/v1/schema/", timeout=1)
            break
        except httpx.HTTPError:
            time.sleep(0.1)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def server() -> Iterator[str]:
    with running_server() as url:
        yield url


def spawn_workers(
    url: str, workers: list, logs: list[Path], *extra: str, seconds: float = SECONDS
) -> list[subprocess.Popen]:
    """One chaos worker process per actor, each logging its history to its own file, for ``seconds``."""
    return [
        subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "chaos" / "worker.py"), url, w.token, w.name, "chaos"]
            + [str(log), str(seconds), *extra],
            cwd=ROOT,
        )
        for w, log in zip(workers, logs, strict=True)
    ]


def kill_mid_commit(proc: subprocess.Popen, log: Path) -> str:
    """SIGKILL the worker while a commit request of its is in flight (its log's last line says SENT); returns
    what became of that commit — the server finishes or abandons it without the worker."""
    deadline, last = time.monotonic() + 10, {}
    while time.monotonic() < deadline:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4000))
            lines = f.read().decode(errors="replace").splitlines()
        last = json.loads(lines[-1]) if len(lines) > 1 else {}
        if last.get("outcome") == "SENT":
            break
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    if last.get("outcome") != "SENT":
        return "no commit was in flight within 10 s"
    time.sleep(0.5)
    task = Task.objects.get(pk=last["task_id"])
    landed = task.state == "COMMITTED" and str(task.attempt_id) == last["attempt_id"]
    return f"its commit of {last['task_id']} {'landed' if landed else 'did not land'}"


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
@pytest.mark.timeout(120 + SECONDS * 4)
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
    procs = spawn_workers(server, workers, logs)
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
    fate = kill_mid_commit(procs[1], logs[1])
    faults.append(f"SIGKILL chaos-w1 during a commit request ({fate})")
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
@pytest.mark.timeout(120 + SECONDS * 4)
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
    procs = spawn_workers(server, workers, logs)
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


def check_effects(target, *, namespace: str = "chaos") -> dict[str, int]:
    """At most one COMMITTED per effect_id, and no call acted on at the target after it; a COMMITTED effect was
    really called; nothing the target did is recorded FAILED. Returns the figures."""
    figures = defaultdict(int)
    for effect in Effect.objects.filter(namespace__name=namespace):
        figures["effects"] += 1
        figures[f"effects_{effect.state.lower()}"] += 1
        committed = list(EffectEvent.objects.filter(effect=effect, to_state="COMMITTED"))
        assert len(committed) <= 1, (effect.effect_id, committed)
        calls = target.calls.get(effect.effect_id, [])
        figures["target_calls"] += len(calls)
        figures["refused_stale_generation"] += len(target.refused.get(effect.effect_id, []))
        figures["keys_called_more_than_once"] += len(calls) > 1
        if committed:
            at = committed[0].at.timestamp()
            assert calls, f"{effect.effect_id} is COMMITTED but the target never acted"
            assert all(c["at"] < at for c in calls), (
                f"a call at the target after {effect.effect_id} COMMITTED"
            )
        assert effect.state != "FAILED" or not calls, f"{effect.effect_id} acted on but recorded FAILED"
    reconciled = EffectEvent.objects.filter(effect__namespace__name=namespace, kind="reconciled")
    figures["reconciled_by_workers"] = reconciled.filter(principal__startswith="chaos-w").count()
    figures["reconciled_by_oncall"] = reconciled.exclude(principal__startswith="chaos-w").count()
    return dict(figures)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120 + SECONDS * 4)
def test_invariants_hold_with_effects_lost_replies_killed_job_workers_a_fence_job_and_a_rollback(
    tmp_path, effect_target, celery_workers
):
    """Scenario 2: a third of the tasks make a direct side effect (the target drops a quarter of its replies after
    acting and fences direct calls on the claim generation), a third dispatch theirs through the gateway (the
    control plane's Celery worker delivers them). Mid-run: the Celery worker is SIGKILLed while it delivers, a
    chaos worker is paused past its lease, an epoch fence runs as the fence_epoch job and its Celery worker is
    SIGKILLed mid-job (resend_fences finishes it on a fresh worker), and the namespace is rolled back
    V1_ONLY → V1_WRITES (fence, drain with on-call reconciling UNKNOWN effects by asking the target, stage back,
    resume) — all while the chaos workers keep going."""
    jobs_env = {
        "DISPATCH_TIMEOUT_SECONDS": "2",
        "DISPATCH_RESEND_AFTER_SECONDS": "7",
        "FENCE_RESEND_AFTER_SECONDS": "1",
    }
    ensure_default_namespace()
    operator, oncall = make_actor("chaos-op", "operator"), make_actor("chaos-oncall", "oncall")
    operator.post("/namespaces", {"name": "chaos"})
    kinds = ("plain", "effect", "dispatch")
    for i in range(150):
        operator.create(namespace="chaos", node_id=f"n{i % 3}", input={"i": i, "kind": kinds[i % 3]})
    effect_target.drop_rate, effect_target.delays = 0.25, {"/notify": 0.3}
    effect_target.fence_paths = {"/charge"}
    celery = celery_workers.start(**jobs_env)
    workers = [make_actor(f"chaos-w{i}", "worker") for i in range(4)]
    logs = [tmp_path / f"{w.name}.jsonl" for w in workers]
    faults: list[str] = []
    with running_server(CELERY_TASK_ALWAYS_EAGER="false") as url:
        # Twice the time of scenario 1: the fence and the rollback pause claims for a while.
        procs = spawn_workers(url, workers, logs, effect_target.url, seconds=SECONDS * 2)

        # The Celery worker killed while it delivers a dispatch; a fresh one takes over.
        assert wait_for(lambda: DispatchIntent.objects.filter(state="SENDING").exists(), seconds=SECONDS)
        celery_workers.kill(celery)
        faults.append("SIGKILL the Celery worker during deliver_dispatch")
        celery = celery_workers.start(**jobs_env)

        os.kill(procs[0].pid, signal.SIGSTOP)  # past its 2-second lease
        time.sleep(2.5)
        os.kill(procs[0].pid, signal.SIGCONT)
        faults.append("SIGSTOP chaos-w0 for 2.5 s")

        # An epoch fence through its job; the Celery worker killed as soon as the job starts.
        epoch_before = Namespace.objects.get(name="chaos").scheduler_epoch
        request = fences.fence_request(
            principal=Principal.objects.get(name=oncall.name), namespace="chaos", reason="chaos"
        )
        # Held on the namespace row, the job's fence cannot commit: the kill lands inside its transaction.
        with row_locked("SELECT 1 FROM claims_namespace WHERE name = %s FOR UPDATE", ["chaos"]):
            fence_epoch.delay("chaos", "chaos", oncall.name, str(request.pk))
            assert wait_for(lambda: FenceRequest.objects.get(pk=request.pk).runs >= 1)
            time.sleep(0.2)
            celery_workers.kill(celery)
        at_kill = FenceRequest.objects.get(pk=request.pk).status
        faults.append(f"SIGKILL the Celery worker during fence_epoch (the request was {at_kill})")
        celery = celery_workers.start(**jobs_env)
        assert wait_for(lambda: resend_fences.delay() and _finished(request.pk), seconds=30), (
            celery_workers.log()
        )
        fenced = FenceRequest.objects.get(pk=request.pk)
        assert fenced.scheduler_epoch == epoch_before + 1 and fenced.self_check["ok"], fenced.summary()
        assert Namespace.objects.get(name="chaos").scheduler_epoch == epoch_before + 1  # fenced once
        oncall.post("/namespaces/chaos/resume", {})
        faults.append(
            f"fence via the job: epoch {epoch_before} → {fenced.scheduler_epoch}, {fenced.runs} runs"
        )

        time.sleep(SECONDS * 0.1)
        # Rollback V1_ONLY → V1_WRITES mid-run: fence, drain (on-call reconciles UNKNOWN effects), stage back.
        started = oncall.post(
            "/namespaces/chaos/rollout/rollback", {"to_stage": "V1_WRITES", "reason": "chaos"}
        )
        assert started.status_code in (200, 202), started.content

        def drained_and_rolled_back() -> bool:
            # On-call's drill: reconcile what is UNKNOWN by asking the target, let the job take a snapshot.
            for effect in Effect.objects.filter(namespace__name="chaos", state="UNKNOWN"):
                occurred = bool(effect_target.calls.get(effect.effect_id))
                oncall.reconcile(None, effect.effect_id, "OCCURRED" if occurred else "NOT_OCCURRED")
            advance_rollback.delay()
            time.sleep(0.5)
            return not Rollback.objects.filter(namespace="chaos", finished_at__isnull=True).exists()

        assert wait_for(drained_and_rolled_back, seconds=30), list(
            DrainSnapshot.objects.filter(namespace="chaos").order_by("-taken_at").values()[:1]
        )
        oncall.post("/namespaces/chaos/resume", {})
        faults.append(f"rollback V1_ONLY → V1_WRITES ({started.json()['outcome']}, then finished by the job)")

        for proc in procs:
            proc.wait(SECONDS * 2 + 60)
        # Every dispatch ends delivered or skipped: the dead worker's deliveries are sent again under their key.
        assert wait_for(lambda: redeliver_dispatches.delay() and _deliveries_done(), seconds=40), (
            celery_workers.log()
        )

    history = check_invariants(logs)
    effects = check_effects(effect_target)
    assert effects["reconciled_by_workers"] >= 1, effects  # the lost-reply path really ran
    assert Namespace.objects.get(name="chaos").stage == "V1_WRITES"
    outcomes = defaultdict(int)
    for e in history:
        outcomes[f"{e['op']}:{e['outcome']}"] += 1
    deliveries = DispatchIntent.objects.filter(effect__namespace__name="chaos")
    print(
        f"\nCHAOS-FX {len(history)} operations, faults: {faults}\noutcomes: {dict(outcomes)}\neffects: {effects}\n"
        f"dispatch intents: {deliveries.count()}, resent: {deliveries.filter(deliveries__gt=1).count()}"
    )


def _finished(fence_id) -> bool:
    time.sleep(0.5)
    return FenceRequest.objects.get(pk=fence_id).finished_at is not None


def _deliveries_done() -> bool:
    time.sleep(1.0)
    return not DispatchIntent.objects.filter(state__in=["PENDING", "SENDING"]).exists()
