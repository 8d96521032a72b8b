"""Settings are strict: a bad value stops start-up with a message naming the variable, never a silent default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def start(**env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings.test", **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DEBUG": "yes"}, "DEBUG"),
        (
            {"DISPATCH_TIMEOUT_SECONDS": "10", "DISPATCH_RESEND_AFTER_SECONDS": "30"},
            "DISPATCH_RESEND_AFTER_SECONDS",
        ),
        ({"FENCE_RESEND_AFTER_SECONDS": "0"}, "FENCE_RESEND_AFTER_SECONDS"),
    ],
)
def test_a_bad_setting_stops_start_up_and_names_itself(env, message):
    started = start(**env)

    assert started.returncode != 0
    assert "ImproperlyConfigured" in started.stderr and message in started.stderr


def test_the_defaults_start():
    assert start().returncode == 0
