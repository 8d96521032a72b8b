"""docs/mcp.md's agent example, run as written: a task whose tools write a file (npm's filesystem server) and create a
record (our counting server), with the first agent killed half-way — after its first tool call — and a second agent
taking over once the lease runs out. The file is written once, the record created once, the task committed by the
second agent."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from claims.models import Effect, Task
from tests.gateway.support import NODE, NODE_DIR, counting_downstream
from tests.support.actors import make_actor

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not NODE.exists(), reason="needs scripts/install-mcp-servers.sh (npm's filesystem server)"
    ),
]

AGENT = Path(__file__).resolve().parents[2] / "examples" / "mcp_agent" / "agent.py"


def test_the_agent_example_survives_a_worker_killed_half_way(gateway_server, tmp_path):
    reports = tmp_path / "reports"
    reports.mkdir()
    ledger = tmp_path / "records.jsonl"
    files = {
        "name": "files",
        "prefix": "fs",
        "command": [str(NODE), str(NODE_DIR / "node_modules/.bin/mcp-server-filesystem"), str(reports)],
    }
    gw = gateway_server(downstreams=[files, counting_downstream(ledger, timeout=10)], timeout=10)
    operator = make_actor("olivia-operator", "operator")
    first, second = make_actor("agent-a", "worker"), make_actor("agent-b", "worker")
    task_id = operator.create(node_id="report", input={"customer": "acme"}).json()["task_id"]

    def agent(actor, *extra):
        argv = [sys.executable, str(AGENT), "--url", gw.url, "--token", actor.token, "--owner", actor.name]
        argv += ["--report-dir", str(reports), "--ttl", "3", *extra]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    doomed = agent(first, "--pause-after-first-tool", "60")
    first_line = json.loads(doomed.stdout.readline())  # its first tool call answered
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait(10)
    assert first_line["tool"] == "write_file" and (reports / "acme.md").exists()

    started = time.monotonic()
    survivor = agent(second)
    out, err = survivor.communicate(timeout=60)
    lines = [json.loads(line) for line in out.splitlines()]

    assert survivor.returncode == 0, err[-3000:]
    assert time.monotonic() - started < 30
    assert [line.get("tool") for line in lines[:2]] == ["write_file", "create_record"]
    assert lines[0]["answer"] == first_line["answer"]  # replayed from the ledger, not written again
    task = Task.objects.get(pk=task_id)
    assert task.state == "COMMITTED" and task.owner_id == "agent-b"
    assert [r["name"] for r in map(json.loads, ledger.read_text().splitlines())] == ["report-acme"]
    assert (reports / "acme.md").read_text() == "# Report for acme\n"
    writes = Effect.objects.get(effect_slot__startswith="mcp:fs__write_file")
    assert writes.dispatches.count() == 1 and writes.state == "COMMITTED"
