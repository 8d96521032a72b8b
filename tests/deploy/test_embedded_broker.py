"""The embedded default survives (issue 13 item 3): with no services at all — SQLite and the embedded broker
(kombu's SQLAlchemy transport on a SQLite file, settings/celery.py) — the server and ``celery worker --beat``
(exactly what ``make run`` starts) run a fixed number of jobs: dispatch deliveries to a real HTTP target, on-call
fences through the fence job, and beat's periodic jobs. The worker is SIGKILLed once while it delivers (the target
has acted; its reply is held), and started again. Every dispatch ends delivered under its own key, every fence is
applied once, and no worker dies on its own (the filesystem broker's JSONDecodeError killed one)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from claims.digest import digest
from deploy.topology import AppServer
from tests.support.processes import FAST_RESEND_ENV, wait_for

ROOT = Path(__file__).resolve().parents[2]
ROUNDS, FENCE_AFTER, KILL_ROUND = 9, (2, 5), 7


def _env(var: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    return {
        **env,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "CONTROLPLANE_VAR_DIR": str(var),
        "CELERY_TASK_ALWAYS_EAGER": "false",
        "DISPATCH_ALLOWED_HOSTS": "127.0.0.1",
        "API_RATE_LIMIT": "",
        **FAST_RESEND_ENV,
    }


def _manage(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _request_fence(env: dict[str, str], reason: str) -> None:
    """The console's path: a recorded request, then the fence job on the broker."""
    _manage(
        env,
        "shell",
        "-c",
        "from claims.models import Principal; from oncall.services import fence; "
        "from oncall.tasks import fence_epoch; "
        f"r = fence(principal=Principal.objects.get(name='oc'), namespace='default', reason='{reason}'); "
        f"fence_epoch.delay('default', '{reason}', 'oc', str(r.pk))",
    )


class Jobs:
    """``celery worker --beat`` as ``make run`` starts it, logging to a file."""

    def __init__(self, env: dict[str, str], var: Path):
        self.env, self.var, self.procs = env, var, []

    def start(self) -> subprocess.Popen:
        log = open(self.var / f"worker-{len(self.procs)}.log", "w")  # noqa: SIM115 - closed by the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "--beat", "--pool", "solo"]
            + ["--loglevel", "INFO", "-s", str(self.var / "celerybeat-schedule")],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the embedded beat runs in a child process: stop() ends the whole group
        )
        self.procs.append(proc)
        assert wait_for(lambda: "ready." in self.log() or proc.poll() is not None, 60), self.log()
        return proc

    def log(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.var.glob("worker-*.log")))

    def stop(self) -> None:
        """Every worker's process group — a worker SIGKILLed mid-job leaves its embedded beat behind otherwise, still
        running beat's jobs after the test (seen: a leftover beat process busy long after the suite ended)."""
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.mark.timeout(300)
def test_the_embedded_broker_runs_dispatches_fences_and_beat_and_survives_a_worker_killed_mid_job(
    tmp_path, effect_target
):
    env = _env(tmp_path)
    _manage(env, "migrate", "--no-input", "-v", "0")
    worker_token = _manage(env, "issue_token", "--role", "worker", "--name", "w1").strip().splitlines()[-1]
    oncall_token = _manage(env, "issue_token", "--role", "oncall", "--name", "oc").strip().splitlines()[-1]
    server = AppServer(tmp_path, env).start()
    jobs = Jobs(env, tmp_path)
    first = jobs.start()
    worker = httpx.Client(
        base_url=f"{server.url}/api/v1", headers={"Authorization": f"Bearer {worker_token}"}
    )
    oncall = httpx.Client(
        base_url=f"{server.url}/api/v1", headers={"Authorization": f"Bearer {oncall_token}"}
    )
    effects, fences, epoch = [], 0, 1
    try:
        for round_ in range(ROUNDS):
            task = oncall.post("/tasks", json={"node_id": "notify", "input": {"round": round_}}).json()
            claim = worker.post(
                f"/tasks/{task['task_id']}/claim",
                json={"owner_id": "w1", "scheduler_epoch": epoch, "ttl_seconds": 120},
            ).json()
            attempt = {k: claim[k] for k in ("attempt_id", "claim_generation", "scheduler_epoch")} | {
                "owner_id": "w1"
            }
            payload = {"round": round_}
            effect = worker.post(
                "/effects/prepare",
                json={"task_id": claim["task_id"], "effect_slot": "notify", "payload_digest": digest(payload)}
                | attempt,
            ).json()
            effects.append(effect["effect_id"])
            path = "/held" if round_ == KILL_ROUND else "/notify"
            if round_ == KILL_ROUND:
                effect_target.holds[path] = threading.Event()  # the target acts, its reply waits
            sent = worker.post(
                f"/effects/{effect['effect_id']}/dispatch",
                json={"payload": payload, "target": f"{effect_target.url}{path}"} | attempt,
            )
            assert sent.status_code == 201, sent.text
            if round_ == KILL_ROUND:
                assert wait_for(
                    lambda p=path: any(c["path"] == p for cs in effect_target.calls.values() for c in cs)
                )
                first.send_signal(signal.SIGKILL)  # mid-job: inside deliver_dispatch, waiting for the reply
                first.wait(10)
                jobs.start()
                effect_target.holds[path].set()
            if round_ in FENCE_AFTER:
                assert wait_for(lambda e=effect["effect_id"]: _state(worker, e) == "COMMITTED", 60), (
                    jobs.log()
                )
                _request_fence(env, f"drill {round_}")
                fences += 1
                assert wait_for(lambda f=fences: _epoch(oncall) == 1 + f, 60), jobs.log()[-3000:]
                assert (
                    oncall.post("/namespaces/default/resume", json={"reason": "drill over"}).status_code
                    == 200
                )
                epoch = 1 + fences

        # Every dispatch delivered, the killed one by beat's redelivery under the same key; each fence once.
        assert wait_for(lambda: all(_state(worker, e) == "COMMITTED" for e in effects), 120), jobs.log()[
            -4000:
        ]
        assert _epoch(oncall) == 1 + fences == 3
        assert set(effect_target.calls) == set(effects)  # one key per effect, the effect's own
        assert (
            len(effect_target.calls[effects[KILL_ROUND]]) == 2
        )  # acted, reply lost with the worker, sent again
        assert all(p.poll() is None for p in jobs.procs[1:]), jobs.log()[-4000:]  # nobody died on its own
        assert "JSONDecodeError" not in jobs.log() and "Unrecoverable error" not in jobs.log()
    finally:
        worker.close()
        oncall.close()
        jobs.stop()
        server.stop()


def _state(client: httpx.Client, effect_id: str) -> str:
    return client.get(f"/effects/{effect_id}").json().get("state", "")


def _epoch(client: httpx.Client) -> int:
    return client.get("/namespaces/default").json()["scheduler_epoch"]
