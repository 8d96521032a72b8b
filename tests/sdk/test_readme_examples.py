"""The clients' README examples, verbatim (issue 37): the TypeScript one compiled with ``"strict": true`` in a project
of its own that installs the package as a user would, then run against a live server; the Python one checked with
``mypy --strict`` and run against the same. The package also loads from a CommonJS project, and ``npm pack`` works
from a clean copy of the client's folder with that one command."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from claims.digest import digest
from claims.models import Task
from tests.sdk.conftest import PackedClient
from tests.support.actors import ensure_default_namespace, make_actor

pytestmark = [pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parents[2]
TS = ROOT / "clients" / "typescript"
needs_node = pytest.mark.skipif(
    not shutil.which("npm"), reason="needs node and npm: run scripts/install-node.sh"
)


def _block(readme: Path, language: str) -> str:
    found = re.search(rf"```{language}\n(.*?)```", readme.read_text(), re.S)
    assert found, f"no {language} example in {readme}"
    return found.group(1)


def _run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, timeout=600, env={**os.environ, **(env or {})}
    )
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _project(tmp_path: Path, client: PackedClient, package: dict) -> Path:
    """A user's project with the client installed (linked: what `npm install <tarball>` puts in node_modules)."""
    (tmp_path / "node_modules").mkdir()
    (tmp_path / "node_modules" / "claim-control-plane-client").symlink_to(client.folder)
    (tmp_path / "node_modules" / "@types").symlink_to(client.folder / "node_modules" / "@types")
    (tmp_path / "package.json").write_text(json.dumps(package))
    return tmp_path


def _tasks(n: int) -> list[str]:
    operator = make_actor("olivia-operator", "operator")
    return [operator.create(node_id="readme", input={"n": i}).json()["task_id"] for i in range(n)]


@needs_node
def test_the_typescript_readme_example_compiles_strict_and_runs(
    live_server, tmp_path, packed_typescript_client
):
    ensure_default_namespace()
    project = _project(tmp_path, packed_typescript_client, {"type": "module"})
    (project / "example.ts").write_text(_block(TS / "README.md", "ts"))
    (project / "tsconfig.json").write_text(
        json.dumps(
            {
                "compilerOptions": {
                    "target": "ES2022", "module": "NodeNext", "moduleResolution": "NodeNext", "strict": True,
                    "noUncheckedIndexedAccess": True, "types": ["node"],
                },
                "files": ["example.ts"],
            }
        )
    )  # fmt: skip
    _run(
        [str(packed_typescript_client.folder / "node_modules/.bin/tsc"), "-p", "tsconfig.json"], project
    )  # strict: no error
    worker = make_actor("worker-7", "worker")
    (task_id,) = _tasks(1)

    said = json.loads(
        _run(["node", "example.js"], project, {"CLAIMS_URL": live_server.url, "WORKER_TOKEN": worker.token})
    )

    assert said == {"task_id": task_id, "commit": 200}
    task = Task.objects.get(pk=task_id)
    assert task.state == "COMMITTED" and task.result == {"answer": 42}


@needs_node
def test_the_typescript_client_loads_from_a_commonjs_project(tmp_path, packed_typescript_client):
    project = _project(
        tmp_path, packed_typescript_client, {"name": "plain-cjs"}
    )  # no "type": CommonJS, npm's default
    (project / "index.js").write_text(
        'const { digest, controlPlane } = require("claim-control-plane-client");\n'
        'console.log(JSON.stringify([digest({ b: 1, a: [1, "x"] }), typeof controlPlane("http://h", "t").POST]));\n'
    )

    said = json.loads(_run(["node", "index.js"], project))

    assert said == [digest({"b": 1, "a": [1, "x"]}), "function"]


@needs_node
def test_npm_pack_works_from_a_clean_copy_with_one_command(packed_typescript_client):
    """The issue: `npm pack` failed with `openapi-typescript: not found` (127) until `npm ci` had run. The fixture
    packs a copy of the folder without node_modules, dist or the generated schema, with `npm pack` alone."""
    with tarfile.open(packed_typescript_client.tarball) as tarball:
        names = set(tarball.getnames())
    assert {"package/dist/index.js", "package/dist/index.d.ts", "package/dist/cjs/index.js"} <= names
    assert "package/dist/cjs/package.json" in names and "package/README.md" in names


def test_the_python_readme_example_passes_mypy_strict_and_runs(live_server, tmp_path):
    ensure_default_namespace()
    example = tmp_path / "example.py"
    example.write_text(_block(ROOT / "clients" / "python" / "README.md", "python"))
    # The SDK as a user's mypy sees it installed (py.typed); its source, since an editable install hides it from mypy.
    sdk = {"MYPYPATH": str(ROOT / "clients" / "python")}
    _run([sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(example)], tmp_path, sdk)
    worker = make_actor("worker-7", "worker")
    task_ids = _tasks(3)

    _run(
        [sys.executable, str(example)],
        tmp_path,
        {"CLAIMS_URL": live_server.url, "WORKER_TOKEN": worker.token, "WORKER_NAME": "worker-7"},
    )

    tasks = Task.objects.filter(pk__in=task_ids)
    assert sorted(t.state for t in tasks) == ["COMMITTED"] * 3
    assert sorted(t.result["echo"]["n"] for t in tasks) == [0, 1, 2]
