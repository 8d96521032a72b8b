"""Every job a service sends by name (``claims.services.enqueue``) is registered once Django is set up, in a
process of its own — not only when a view or a test happened to import the module that defines it. The console's
fence sent ``oncall.fence_epoch`` by name and got ``NotRegistered`` (a 500) in a fresh server process, until the
on-call app registered its jobs when it is ready."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import django
django.setup()
from celery import current_app
print(" ".join(sorted(name for name in current_app.tasks if not name.startswith("celery."))))
"""


@pytest.mark.parametrize(
    ("settings_module", "jobs"),
    [
        ("controlplane.settings.test", {"oncall.fence_epoch", "oncall.resend_fences", "claims.deliver_dispatch", "rollout.import_legacy_rows"}),
        ("controlplane.settings.test_core", {"oncall.fence_epoch", "oncall.resend_fences", "claims.deliver_dispatch"}),
    ],
)  # fmt: skip
def test_the_jobs_services_send_by_name_are_registered_in_a_fresh_process(settings_module, jobs):
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": settings_module}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert jobs <= set(done.stdout.split()), done.stdout
