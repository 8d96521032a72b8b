"""``claimctl run`` (the embedded default on one machine: the server, one job worker and beat) and ``claimctl up``
(the production profile on one host: gunicorn, N Celery workers and beat): processes of one supervisor, stopped
together by one Ctrl-C or SIGTERM.

Each process runs in a process group of its own, so the terminal's Ctrl-C reaches only this supervisor, which then
sends each group one SIGTERM (Celery's warm shutdown: a running job finishes), waits up to ``STOP_SECONDS`` and
SIGKILLs what is left; it prints one line per process. Beat is its own process, never a ``--beat`` child of the
worker that outlives it (issue 25). Each child asks the kernel for SIGTERM when the supervisor dies
(``PR_SET_PDEATHSIG``), so a supervisor killed with SIGKILL leaves nothing running; if any one process ends, the
supervisor stops the others and exits with its status.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

STOP_SECONDS = 40  # a job's warm shutdown and a waiting claim (≤ 30 s) both fit
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the supervisor dies, whatever kills it (Linux)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:  # not Linux: the stop path still ends the group
        pass


def processes(host: str, port: str, loglevel: str = "WARNING") -> dict[str, list[str]]:
    python = sys.executable
    from django.conf import settings

    return {
        # uvicorn, one process, on the ASGI application: the API and console, and the MCP gateway under /mcp (whose
        # session manager and downstream connections the ASGI lifespan runs) — as `claimctl serve` has them.
        "web": [
            python,
            "-m",
            "uvicorn",
            "controlplane.asgi:application",
            "--host",
            host,
            "--port",
            str(port),
            "--log-level",
            loglevel.lower(),
        ],
        "worker": [
            python,
            "-m",
            "celery",
            "-A",
            "controlplane",
            "worker",
            "--pool",
            "solo",
            "--loglevel",
            loglevel,
        ],
        "beat": [
            python,
            "-m",
            "celery",
            "-A",
            "controlplane",
            "beat",
            "--loglevel",
            loglevel,
            "--schedule",
            settings.CELERY_BEAT_SCHEDULE_FILENAME,
        ],  # fmt: skip
    }


def supervise(
    commands: dict[str, list[str]], *, stop_seconds: float = STOP_SECONDS, label: str = "claimctl run"
) -> int:
    """Start every command; return when one ends (its status) or on SIGINT/SIGTERM (0), all of them stopped."""
    stopping = {"signal": 0}

    def ask_to_stop(signum, _frame) -> None:
        if stopping["signal"]:  # a second Ctrl-C: no more waiting
            for child in children.values():
                _signal_group(child, signal.SIGKILL)
        stopping["signal"] = signum

    children: dict[str, subprocess.Popen] = {}
    previous = {sig: signal.signal(sig, ask_to_stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        for name, argv in commands.items():
            children[name] = subprocess.Popen(argv, start_new_session=True, preexec_fn=_die_with_parent)  # noqa: PLW1509
        status = 0
        while not stopping["signal"]:
            ended = {name: child.poll() for name, child in children.items() if child.poll() is not None}
            if ended:
                name, status = next(iter(ended.items()))
                print(f"{label}: {name} ended ({status}); stopping the others", file=sys.stderr, flush=True)
                break
            time.sleep(0.2)
        _stop(children, stop_seconds, label)
        return status
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _signal_group(child: subprocess.Popen, sig: int) -> None:
    try:
        os.killpg(child.pid, sig)
    except ProcessLookupError:
        pass


def _stop(children: dict[str, subprocess.Popen], stop_seconds: float, label: str) -> None:
    for child in children.values():
        if child.poll() is None:
            _signal_group(child, signal.SIGTERM)
    deadline = time.monotonic() + stop_seconds
    for name, child in children.items():
        try:
            child.wait(max(0.1, deadline - time.monotonic()))
            how = f"stopped ({child.returncode})"
        except subprocess.TimeoutExpired:
            _signal_group(child, signal.SIGKILL)
            child.wait()
            how = f"killed after {stop_seconds:.0f} s"
        _signal_group(child, signal.SIGKILL)  # whatever it left in its group
        print(f"{label}: {name} {how}", file=sys.stderr, flush=True)


def run_production(argv: Sequence[str]) -> int:
    """``claimctl up [--workers N]``: gunicorn (``claimctl serve``), N Celery workers and one beat, supervised."""
    import django

    workers = int(argv[argv.index("--workers") + 1]) if "--workers" in argv else 2
    django.setup()
    from django.conf import settings

    python = sys.executable
    commands = {"web": [python, "-m", "controlplane.cli", "serve"]}
    for i in range(1, workers + 1):
        commands[f"worker{i}"] = [
            python, "-m", "controlplane.cli", "worker", "--hostname", f"worker{i}@%h",
        ]  # fmt: skip
    commands["beat"] = [
        python, "-m", "controlplane.cli", "beat", "--schedule", settings.CELERY_BEAT_SCHEDULE_FILENAME,
    ]  # fmt: skip
    return supervise(commands, label="claimctl up")


def run_embedded(argv: Sequence[str]) -> int:
    """Migrate, then supervise the server, a worker and beat on the embedded default."""
    import django

    django.setup()
    from django.core.management import call_command

    host = os.environ.get("HOST", "127.0.0.1")
    port = os.environ.get("PORT", "8000")
    call_command("migrate", "--no-input", verbosity=0)
    print(
        f"claim control plane on http://{host}:{port}/api/v1/docs/  "
        "(tokens: claimctl issue-token --role worker --name w1) — Ctrl-C stops it",
        flush=True,
    )
    return supervise(processes(host, port))
