"""Downstreams come and go (docs/mcp.md "Downstreams that restart"): a stateful Streamable HTTP server restarted, a
server down for a while, a stdio child killed, a server that hangs. Through the production server (gunicorn, two
uvicorn processes, PostgreSQL); the counting server's ledger is what happened downstream. In each case the gateway
opens a new session or process by itself, records nothing as sent that reached nothing, keeps the server's tools
listed, and recovers without being restarted."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from claims.models import DispatchIntent, Effect
from gateway.models import ToolCall
from tests.gateway.support import COUNTING, agent_session, call, outcome, run_async, wait_port

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

RECORD = "rec__create_record"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Downstream:
    """The counting server on Streamable HTTP, on a fixed port, that a test stops and starts again."""

    def __init__(self, ledger: Path, log: Path, *flags: str) -> None:
        self.ledger, self.log, self.flags = ledger, log, flags
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        out = open(self.log, "a")  # noqa: SIM115 - the process owns it
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(COUNTING),
                "--ledger",
                str(self.ledger),
                "--port",
                str(self.port),
                *self.flags,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        wait_port(self.port)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
            self.proc = None

    def records(self) -> list[str]:
        if not self.ledger.exists():
            return []
        return [line for line in self.ledger.read_text().splitlines() if line.strip()]


@contextmanager
def http_downstream(tmp_path: Path, *flags: str) -> Iterator[Downstream]:
    server = Downstream(tmp_path / "ledger.jsonl", tmp_path / "downstream.log", *flags)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _claim(operator, agent) -> str:
    return agent.claim(operator.create(node_id="n").json()["task_id"]).json()["attempt_id"]


def _listed(url: str, token: str, attempt: str) -> set[str]:
    async def go() -> set[str]:
        async with agent_session(url, token, attempt) as session:
            return {tool.name for tool in (await session.list_tools()).tools}

    return run_async(go)


def _gateway(gateway_server, downstream: Downstream, timeout: float = 3.0, processes: int = 2):
    return gateway_server(
        processes=processes,
        downstreams=[
            {"name": "counting", "prefix": "rec", "url": downstream.url, "call_timeout_seconds": timeout}
        ],
    )


def test_a_stateful_downstream_that_restarts_gets_a_new_session_and_every_call_lands_once(
    gateway_server, people, tmp_path
):
    """Before: after the restart every call was −32600 "Session not found", recorded FAILED (6 of 6), then −32603."""
    operator, agent = people
    with http_downstream(tmp_path, "--stateful") as downstream:
        gw = _gateway(gateway_server, downstream)
        attempt = _claim(operator, agent)
        for i in range(4):  # both gateway processes hold a session
            assert not call(gw.url, agent.token, attempt, RECORD, {"name": f"before-{i}"}).is_error
        downstream.stop()
        downstream.start()  # every session the gateway held is gone
        answers = [call(gw.url, agent.token, attempt, RECORD, {"name": f"after-{i}"}) for i in range(6)]
        assert [a.is_error for a in answers] == [False] * 6, [a.content for a in answers]
        assert "rec__create_record" in _listed(gw.url, agent.token, attempt)

    assert len(downstream.records()) == 10
    assert set(Effect.objects.values_list("state", flat=True)) == {"COMMITTED"}
    assert Effect.objects.count() == 10
    assert set(ToolCall.objects.values_list("sends", flat=True)) == {1}


def test_a_downstream_down_for_a_while_is_unavailable_then_back_without_a_gateway_restart(
    gateway_server, people, tmp_path
):
    """While it is down: UNAVAILABLE, nothing recorded as sent, nothing UNKNOWN, its tools still listed. Once it is
    back, the same calls run — once each. (One process: the tool list kept is each process's own — a process that
    never reached the server has none to show.)"""
    operator, agent = people
    with http_downstream(tmp_path, "--stateful") as downstream:
        gw = _gateway(gateway_server, downstream, processes=1)
        attempt = _claim(operator, agent)
        assert not call(gw.url, agent.token, attempt, RECORD, {"name": "first"}).is_error
        downstream.stop()
        down = [call(gw.url, agent.token, attempt, RECORD, {"name": f"down-{i}"}) for i in range(4)]
        assert [outcome(a) for a in down] == ["UNAVAILABLE"] * 4
        assert "rec__create_record" in _listed(gw.url, agent.token, attempt)
        assert not Effect.objects.filter(state="UNKNOWN").exists()
        assert not DispatchIntent.objects.filter(not_sent=False, outcome="FAILED").exists()
        downstream.start()
        back = [call(gw.url, agent.token, attempt, RECORD, {"name": f"down-{i}"}) for i in range(4)]
        assert [a.is_error for a in back] == [False] * 4, [a.content for a in back]

    names = sorted(line.split('"name": "')[1].split('"')[0] for line in downstream.records())
    assert names == ["down-0", "down-1", "down-2", "down-3", "first"]
    assert set(Effect.objects.values_list("state", flat=True)) == {"COMMITTED"}
    assert not DispatchIntent.objects.filter(outcome="UNKNOWN").exists()


def _children(ledger: Path) -> list[int]:
    found = subprocess.run(
        ["pgrep", "-f", f"counting_server.py --ledger {ledger}"], capture_output=True, text=True
    )
    return [int(pid) for pid in found.stdout.split()]


def test_a_stdio_child_that_died_is_started_again_before_the_next_call_is_sent(gateway_server, people):
    """Before: the first call on each process after the child died was UNKNOWN "Connection closed"."""
    operator, agent = people
    gw = gateway_server()
    attempt = _claim(operator, agent)
    for i in range(4):
        assert not call(gw.url, agent.token, attempt, RECORD, {"name": f"before-{i}"}).is_error
    children = _children(gw.ledger)
    assert children
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.5)
    answers = [call(gw.url, agent.token, attempt, RECORD, {"name": f"after-{i}"}) for i in range(6)]
    assert [a.is_error for a in answers] == [False] * 6, [a.content for a in answers]
    assert len(gw.records()) == 10
    assert set(Effect.objects.values_list("state", flat=True)) == {"COMMITTED"}
    assert not set(_children(gw.ledger)) & set(children)


def test_a_downstream_that_hangs_costs_its_callers_a_timeout_not_the_gateway(
    gateway_server, people, tmp_path
):
    """A stopped (SIGSTOP) server: a call sent to it is UNKNOWN after the timeout (it may act when it wakes), the
    tools stay listed, and once it runs again the gateway reaches it with no restart."""
    operator, agent = people
    with http_downstream(tmp_path) as downstream:
        gw = _gateway(
            gateway_server, downstream, timeout=2.0, processes=1
        )  # the process that listed its tools
        attempt = _claim(operator, agent)
        assert not call(gw.url, agent.token, attempt, RECORD, {"name": "first"}).is_error
        assert downstream.proc is not None
        os.kill(downstream.proc.pid, signal.SIGSTOP)
        try:
            hung = call(gw.url, agent.token, attempt, RECORD, {"name": "hung"})
            assert outcome(hung) == "UNKNOWN"
            assert "rec__create_record" in _listed(gw.url, agent.token, attempt)
        finally:
            os.kill(downstream.proc.pid, signal.SIGCONT)
        after = call(gw.url, agent.token, attempt, RECORD, {"name": "after"})
        assert not after.is_error, after.content

    assert Effect.objects.get(state="UNKNOWN")  # the hung call: it was sent, so it may have acted
    assert Effect.objects.filter(state="COMMITTED").count() == 2
