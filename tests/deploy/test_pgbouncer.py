"""Behind PgBouncer in transaction mode (Debian's pgbouncer, started by deploy/topology.py): a singleton job's lock
(claims/locks.py) is held by one process at a time. With a session-level advisory lock it was not: the pooler gave
the second process the very server connection the first had taken the lock on, and the lock let it in."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.topology import PgBouncer
from tests.support.processes import process_database_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parents[2]

HOLD = """
import os, sys, time, django
django.setup()
from claims.locks import singleton
with singleton("topology-test") as got:
    print(got, flush=True)
    deadline = time.monotonic() + 30
    while got and not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
        time.sleep(0.05)
"""


@pytest.fixture
def pgbouncer(tmp_path):
    if shutil.which("pgbouncer") is None and not Path("/usr/sbin/pgbouncer").exists():
        pytest.skip("needs Debian's pgbouncer: scripts/install-topology.sh (.ci/run runs it)")
    bouncer = PgBouncer(tmp_path, process_database_url(), pool_size=2).start()
    yield bouncer
    bouncer.stop()


def _holder(bouncer: PgBouncer, release: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "controlplane.settings",
        "DATABASE_URL": bouncer.url_for(process_database_url()),
        "DATABASE_PGBOUNCER": "true",
    }
    return subprocess.Popen(
        [sys.executable, "-c", HOLD, str(release)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )


def test_a_singleton_lock_is_held_by_one_process_at_a_time_through_pgbouncer(pgbouncer, tmp_path):
    release = tmp_path / "release"
    first = _holder(pgbouncer, release)
    assert first.stdout is not None and first.stdout.readline().strip() == "True"

    second = _holder(
        pgbouncer, release
    )  # two server connections: the first keeps one, LIFO hands out the one it used
    assert second.stdout is not None
    while_held = second.stdout.readline().strip()
    second.wait(30)
    release.touch()
    first.wait(30)
    third = _holder(pgbouncer, tmp_path / "never")
    assert third.stdout is not None
    after = third.stdout.readline().strip()
    release_third = tmp_path / "never"
    release_third.touch()
    third.wait(30)

    assert while_held == "False"  # the lock is the first process's while it runs
    assert after == "True"  # and free once it has ended


def test_a_killed_holder_frees_the_lock_through_pgbouncer(pgbouncer, tmp_path):
    first = _holder(pgbouncer, tmp_path / "release")
    assert first.stdout is not None and first.stdout.readline().strip() == "True"

    first.kill()  # the client connection drops: PgBouncer ends the server side's transaction, and the lock
    first.wait(10)
    deadline = time.monotonic() + 20
    got = ""
    while time.monotonic() < deadline:
        probe = _holder(pgbouncer, tmp_path / "release")
        assert probe.stdout is not None
        (tmp_path / "release").touch()
        got = probe.stdout.readline().strip()
        probe.wait(30)
        (tmp_path / "release").unlink()
        if got == "True":
            break
        time.sleep(0.2)

    assert got == "True"
