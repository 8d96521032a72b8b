"""The README's worked session, run verbatim (the ``sh`` block under "A worked session") by bash against a live
production server on the test database: a late worker's commit comes back FENCED and the canonical result is the
second worker's. Every command must succeed (``bash -eu``), the FENCED check included."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from claims.models import Task
from tests.support.actors import ensure_default_namespace
from tests.support.processes import server_env

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]


def session() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## A worked session") :]
    return re.search(r"```sh\n(.*?)```", section, flags=re.DOTALL).group(1)


def test_the_readme_session_runs_as_written(app_servers):
    if not (ROOT / ".venv/bin/claimctl").exists():
        pytest.skip("the session calls .venv/bin/claimctl (make creates it)")
    ensure_default_namespace()
    server = app_servers()

    done = subprocess.run(
        ["bash", "-eu", "-c", session()],
        cwd=ROOT,
        env=server_env(S=f"{server.url}/api/v1", DJANGO_SETTINGS_MODULE="controlplane.settings"),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stdout + done.stderr
    task = Task.objects.get(task_id__startswith="run-", node_id="parse")
    assert task.state == "COMMITTED" and task.result == {"ast": "by-b"}
    assert '"outcome":"FENCED"' in done.stdout.replace(" ", "")
