"""The TypeScript client packed once per run, as a user packs it: a clean copy of its folder (no node_modules, no
dist, no generated schema) and the one documented command, ``npm pack``. The README examples, the CommonJS project
and the consumer project all use this one build."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TS = ROOT / "clients" / "typescript"


@dataclass(frozen=True)
class PackedClient:
    folder: Path  # the clean copy, built by `npm pack` (dist/, node_modules/ with the dev dependencies)
    tarball: Path


@pytest.fixture(scope="session")
def packed_typescript_client(tmp_path_factory) -> PackedClient:
    if not shutil.which("npm"):
        pytest.skip("needs node and npm: run scripts/install-node.sh")
    base = tmp_path_factory.mktemp("typescript-client")
    clean = base / "typescript"
    shutil.copytree(TS, clean, ignore=shutil.ignore_patterns("node_modules", "dist", "*.tgz", "schema.ts"))
    shutil.copy(
        ROOT / "clients" / "openapi.json", base / "openapi.json"
    )  # ../openapi.json, as in the checkout
    done = subprocess.run(["npm", "pack", "--silent"], cwd=clean, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"npm pack:\n{done.stdout}\n{done.stderr}"
    return PackedClient(folder=clean, tarball=clean / done.stdout.strip().splitlines()[-1])
