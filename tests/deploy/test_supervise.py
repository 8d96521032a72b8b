"""``claimctl run`` as a supervisor a team can trust (issue 25, point 3): the server, the worker and beat are three
processes — beat never a ``--beat`` child that outlives its worker — and whichever of the four is SIGKILLed (the
supervisor itself included), nothing is left running: the supervisor stops the others when one dies, and each
child gets SIGTERM from the kernel when the supervisor dies (``PR_SET_PDEATHSIG``). Before, ``make serve``'s trap
re-triggered itself on Ctrl-C, and a SIGKILLed ``celery worker --beat`` left its beat sending jobs for minutes."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from deploy.topology import ROOT, Process, free_port
from tests.deploy.test_clean_install import _descendants, _ready, _running
from tests.support.processes import wait_for


def _start(tmp_path) -> tuple[Process, str]:
    port = free_port()
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": "/root",
        "CONTROLPLANE_VAR_DIR": str(tmp_path / "var"),
        "PORT": str(port),
        "SECRET_KEY": "supervise-" + "k" * 40 + "abcdefgh",
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
    }
    run = Process("claimctl-run", [sys.executable, "-m", "controlplane.cli", "run"], env, tmp_path).start()
    url = f"http://127.0.0.1:{port}"
    _ready(url, run)
    assert wait_for(lambda: len(_children(run)) == 3, 20), run.log()[-3000:]
    return run, url


def _children(run: Process) -> dict[str, int]:
    """The supervisor's three children by role, from their command lines."""
    assert run.proc is not None
    found = {}
    for pid in _descendants(run.proc.pid):
        try:
            cmdline = open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
        except FileNotFoundError:
            continue
        for role, mark in (("web", "uvicorn controlplane.asgi"), ("worker", " worker "), ("beat", " beat ")):
            if mark in cmdline and role not in found:
                found[role] = pid
    return found


@pytest.mark.timeout(180)
@pytest.mark.parametrize("victim", ["supervisor", "web", "worker", "beat"])
def test_whichever_process_is_killed_nothing_is_left_running(victim, tmp_path):
    run, _ = _start(tmp_path)
    assert run.proc is not None
    family = _descendants(run.proc.pid) | {run.proc.pid}
    roles = _children(run)
    assert set(roles) == {"web", "worker", "beat"}  # beat is a process of its own

    target = run.proc.pid if victim == "supervisor" else roles[victim]
    started = time.monotonic()
    os.kill(target, signal.SIGKILL)

    assert wait_for(lambda: not _running(family), 60), (victim, _running(family), run.log()[-3000:])
    took = time.monotonic() - started
    assert took < 45, took
    if victim != "supervisor":
        run.proc.wait(10)
        assert run.proc.returncode != 0  # the supervisor says a process died: it is not a clean stop
        assert f"claimctl run: {victim} ended" in run.log(), run.log()[-3000:]


@pytest.mark.timeout(120)
def test_one_sigint_stops_all_three_with_a_line_each_and_no_traceback(tmp_path):
    run, url = _start(tmp_path)
    assert run.proc is not None
    family = _descendants(run.proc.pid)

    run.proc.send_signal(
        signal.SIGINT
    )  # what Ctrl-C sends the supervisor (its children are in their own groups)
    run.proc.wait(45)

    assert run.proc.returncode == 0 and wait_for(lambda: not _running(family), 10)
    log = run.log()
    lines = [line for line in log.splitlines() if line.startswith("claimctl run:")]
    assert sorted(line.split()[2] for line in lines) == ["beat", "web", "worker"], log[-3000:]
    assert "Traceback" not in log and "Warm shutdown" in log, log[-3000:]
    assert log.count("Warm shutdown") == 1, log[-3000:]  # one line, not thousands


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(180)
def test_make_serves_supervisor_stops_gunicorn_workers_and_beat_on_one_sigterm(tmp_path):
    """`make serve` = `claimctl up`: gunicorn, N Celery workers and one beat on PostgreSQL and Redis — one SIGTERM,
    a line each, nothing left (its trap used to re-trigger itself and leave a worker behind)."""
    from tests.support.processes import _redis_broker, server_env

    broker = _redis_broker()
    if broker is None:
        pytest.skip("needs a reachable Redis in CELERY_BROKER_URL (redis://…); .ci/run sets one")
    port = free_port()
    env = server_env(
        CELERY_BROKER_URL=broker, BIND=f"127.0.0.1:{port}", WEB_CONCURRENCY="1",
        CONTROLPLANE_VAR_DIR=str(tmp_path / "var"), PYTHONPATH=str(ROOT),
    )  # fmt: skip
    up = Process(
        "claimctl-up", [sys.executable, "-m", "controlplane.cli", "up", "--workers", "2"], env, tmp_path
    )
    up.start()
    assert up.proc is not None
    _ready(f"http://127.0.0.1:{port}", up)
    assert wait_for(lambda: up.log().count("ready.") >= 2, 60), up.log()[-3000:]  # both Celery workers
    family = _descendants(up.proc.pid)

    up.proc.send_signal(signal.SIGTERM)
    up.proc.wait(60)

    assert up.proc.returncode == 0 and wait_for(lambda: not _running(family), 10), up.log()[-3000:]
    lines = [line for line in up.log().splitlines() if line.startswith("claimctl up:")]
    assert sorted(line.split()[2] for line in lines) == ["beat", "web", "worker1", "worker2"], up.log()[
        -3000:
    ]
    assert all(" stopped (" in line for line in lines) and "Traceback" not in up.log(), up.log()[-3000:]


@pytest.mark.timeout(60)
def test_a_process_that_dies_under_claimctl_up_is_reported_by_claimctl_up(capfd):
    """Issue 37: a worker killed under `claimctl up` was reported as `claimctl run: worker2 ended (-9)`."""
    from controlplane.supervise import supervise

    status = supervise(
        {
            "worker2": [
                sys.executable,
                "-c",
                "import os, signal, time; time.sleep(0.5); os.kill(os.getpid(), 9)",
            ],
            "beat": [sys.executable, "-c", "import time; time.sleep(30)"],
        },
        stop_seconds=5,
        label="claimctl up",
    )

    said = capfd.readouterr().err
    assert status != 0 and "claimctl up: worker2 ended (-9)" in said and "claimctl run" not in said, said
