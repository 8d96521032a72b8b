"""The Dockerfile and compose.yaml cannot be built or run here (the machines have the Docker client but no engine);
this is what checks them: the compose file parses, runs exactly one beat, points every role at the image's own
entry points, and sets only settings the code reads; every path the Dockerfile copies exists, and its commands are
the ones the tested topology runs (deploy/topology.py)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def _compose() -> dict:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


def test_compose_runs_one_beat_workers_a_server_and_a_migration_first():
    services = _compose()["services"]
    commands = {name: " ".join(svc.get("command", [])) for name, svc in services.items()}

    beats = [name for name, command in commands.items() if command.startswith("claimctl beat")]
    assert beats == ["beat"] and "replicas" not in services["beat"].get("deploy", {})
    assert "worker" in commands["worker"] and services["worker"]["deploy"]["replicas"] >= 1
    assert commands["migrate"] == "claimctl migrate --no-input"
    for name in ("web", "worker", "beat"):
        assert services[name]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert "/readyz" in " ".join(services["web"]["healthcheck"]["test"])


def test_compose_sets_only_settings_the_code_reads():
    settings_text = "\n".join(p.read_text() for p in (ROOT / "controlplane/settings").glob("*.py"))
    env = _compose()["services"]["migrate"]["environment"]

    for name in env:
        assert re.search(rf'env_\w+\("{name}"', settings_text), f"{name} is not a setting"


def test_the_dockerfile_copies_what_exists_and_serves_as_the_topology_does():
    text = (ROOT / "Dockerfile").read_text()
    copied = [line.split()[1:-1] for line in text.splitlines() if line.startswith("COPY ")]
    topology = (ROOT / "deploy/topology.py").read_text()

    for sources in copied:
        for source in sources:
            assert (ROOT / source).exists(), source
    assert 'CMD ["claimctl", "serve"]' in text  # what the clean-install test runs from the wheel
    assert "deploy/gunicorn.conf.py" in topology and "controlplane.asgi:application" in topology
    packages = set(
        re.findall(r'"(\w+)\*"', (ROOT / "pyproject.toml").read_text().split("packages.find")[1][:200])
    )
    assert {
        source.rstrip("/") for sources in copied for source in sources
    } >= packages  # every package copied
    assert "pip install --no-cache-dir ." in text  # the same install the clean-venv test proves
