"""Clients that publish (issue 25, point 2). The OpenAPI schema is committed (clients/openapi.json) and is the
server's; the TypeScript client packs (`npm pack`) into a package with an entry point, bundled types generated from
that schema and a README, and works from a separate TypeScript project against a live server; the Python client
builds as a wheel that works from a clean venv; both clients' versions follow the contract's (claim.v1 with its
§9 and §10 additions: 1.10.x)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from django.core.management import call_command

from claims.models import Task
from tests.support.actors import ensure_default_namespace, make_actor

ROOT = Path(__file__).resolve().parents[2]
TS = ROOT / "clients" / "typescript"
SCHEMA = ROOT / "clients" / "openapi.json"


def _run(command: list[str], cwd: Path, **kwargs) -> str:
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600, **kwargs)
    assert done.returncode == 0, f"{' '.join(command)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_the_committed_schema_is_the_one_the_server_serves(tmp_path):
    generated = tmp_path / "openapi.json"
    call_command("spectacular", "--format", "openapi-json", "--file", str(generated))

    assert json.loads(generated.read_text()) == json.loads(SCHEMA.read_text()), (
        "clients/openapi.json is stale: `make schema` writes it again"
    )


def test_both_clients_versions_follow_the_contracts():
    contract = json.loads(SCHEMA.read_text())["info"]["x-contract-version"]
    package = json.loads((TS / "package.json").read_text())
    python_client = (ROOT / "clients/python/pyproject.toml").read_text()

    assert contract == "1.10"
    assert (
        package["version"].startswith(contract + ".") and f'version = "{package["version"]}"' in python_client
    )
    assert not package.get("private") and package["types"] == "dist/index.d.ts"


CONSUMER = """
import { controlPlane, digest, type components } from "claim-control-plane-client";

type Claim = components["schemas"]["ClaimOut"];
const [baseUrl, token, owner] = process.argv.slice(2) as [string, string, string];
const cp = controlPlane(baseUrl, token);

const ns = await cp.GET("/api/v1/namespaces/{ns}", { params: { path: { ns: "default" } } });
const epoch = ns.data!.scheduler_epoch;
const next = async (): Promise<Claim> => {
  const { data } = await cp.POST("/api/v1/claims", {
    body: { owner_id: owner, scheduler_epoch: epoch, ttl_seconds: 30, namespace: "default", wait_seconds: 0 },
  });
  if (!data || !("attempt_id" in data)) throw new Error("nothing claimed");
  return data as Claim;
};
const commit = (claim: Claim, result: unknown) =>
  cp.POST("/api/v1/tasks/{task_id}/commit", {
    params: { path: { task_id: claim.task_id } },
    body: {
      attempt_id: claim.attempt_id, scheduler_epoch: claim.scheduler_epoch, claim_generation: claim.claim_generation,
      observed_cancel_generation: claim.cancel_generation, input_digest: claim.input_digest,
      result: result as never, result_digest: digest(result),
    },
  });

const first = await next();
await cp.POST("/api/v1/tasks/{task_id}/release", {
  params: { path: { task_id: first.task_id } },
  body: { attempt_id: first.attempt_id, claim_generation: first.claim_generation, owner_id: owner,
          scheduler_epoch: first.scheduler_epoch },
});
const second = await next();
const renewed = await cp.POST("/api/v1/tasks/{task_id}/renew", {
  params: { path: { task_id: second.task_id } },
  body: { attempt_id: second.attempt_id, claim_generation: second.claim_generation, owner_id: owner,
          scheduler_epoch: second.scheduler_epoch, cancel_generation: second.cancel_generation, extend_seconds: 30 },
});
const committed = await commit(second, { by: "second" });
const late = await commit(first, { by: "first" });
const body = late.error as { outcome?: string; reason?: string } | undefined;
console.log(JSON.stringify({
  task_id: second.task_id, renewed: renewed.response.status, committed: committed.response.status,
  late: late.response.status, late_outcome: body?.outcome, late_reason: body?.reason,
}));
"""


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif(not shutil.which("npm"), reason="needs node and npm: run scripts/install-node.sh")
@pytest.mark.timeout(600)
def test_the_packed_typescript_client_works_from_another_project(
    live_server, tmp_path, packed_typescript_client
):
    ensure_default_namespace()
    tarball = packed_typescript_client.tarball  # `npm pack` from a clean copy of clients/typescript
    with tarfile.open(tarball) as archive:
        names = set(archive.getnames())
    assert {
        "package/dist/index.js",
        "package/dist/index.d.ts",
        "package/dist/schema.d.ts",
        "package/README.md",
    } <= names
    assert not any("src/" in name for name in names)  # the built package, not the sources

    project = tmp_path / "consumer"
    project.mkdir()
    devs = json.loads((TS / "package.json").read_text())["devDependencies"]
    (project / "package.json").write_text(
        json.dumps(
            {
                "name": "consumer",
                "private": True,
                "type": "module",
                "dependencies": {"claim-control-plane-client": f"file:{tarball}"},
                "devDependencies": {"typescript": devs["typescript"], "@types/node": devs["@types/node"]},
            }
        )
    )
    (project / "tsconfig.json").write_text(
        json.dumps(
            {
                "compilerOptions": {
                    "target": "ES2022", "module": "NodeNext", "moduleResolution": "NodeNext", "strict": True,
                    "outDir": "out", "types": ["node"],
                },
                "include": ["main.ts"],
            }
        )
    )  # fmt: skip
    (project / "main.ts").write_text(CONSUMER)
    _run(["npm", "install", "--no-audit", "--no-fund"], project)
    _run(["npx", "tsc", "-p", "tsconfig.json"], project)  # typed by the package's bundled declarations
    operator = make_actor("olivia-operator", "operator")
    worker = make_actor("ts-consumer", "worker")
    task_id = operator.create(node_id="consumer").json()["task_id"]

    answer = json.loads(_run(["node", "out/main.js", live_server.url, worker.token, worker.name], project))

    assert answer["task_id"] == task_id
    assert (answer["renewed"], answer["committed"], answer["late"]) == (200, 200, 409)
    assert (answer["late_outcome"], answer["late_reason"]) == ("FENCED", "GENERATION")
    task = Task.objects.get(pk=task_id)
    assert task.state == "COMMITTED" and task.result == {"by": "second"}


PYTHON_FLOW = """
import json, sys
from claim_client import ControlPlane, ClaimRejected, __version__
url, token, owner, task_id = sys.argv[1:]
with ControlPlane(url, token, owner_id=owner) as cp:
    epoch = cp.namespace("default")["scheduler_epoch"]
    first = cp.claim(task_id, scheduler_epoch=epoch, ttl_seconds=30)
    cp.release(first)
    second = cp.claim(task_id, scheduler_epoch=epoch, ttl_seconds=30)
    cp.renew(second, extend_seconds=30)
    cp.commit(second, {"by": "second"})
    try:
        cp.commit(first, {"by": "first"})
        late = None
    except ClaimRejected as exc:
        late = [exc.outcome, exc.reason]
print(json.dumps({"version": __version__, "late": late}))
"""


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(600)
def test_the_python_client_wheel_works_from_a_clean_venv(live_server, tmp_path):
    ensure_default_namespace()
    wheels = tmp_path / "wheels"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "-w",
            str(wheels),
            str(ROOT / "clients/python"),
        ],
        ROOT,
    )
    (wheel,) = wheels.glob("claim_client-*.whl")
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root")}
    _run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet", str(wheel)], tmp_path, env=env)
    operator = make_actor("olivia-operator", "operator")
    worker = make_actor("py-consumer", "worker")
    task_id = operator.create(node_id="py").json()["task_id"]

    answer = json.loads(
        _run(
            [
                str(venv / "bin/python"),
                "-c",
                PYTHON_FLOW,
                live_server.url,
                worker.token,
                worker.name,
                task_id,
            ],
            tmp_path,
            env=env,
        )
    )

    assert answer == {"version": "1.10.0", "late": ["FENCED", "GENERATION"]}
    assert Task.objects.get(pk=task_id).result == {"by": "second"}
