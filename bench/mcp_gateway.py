"""The MCP gateway's cost (issues 26 and 35, docs/benchmarks.md): its added latency per tool call against calling
the downstream server directly — direct and gateway calls interleaved one by one, ``--runs`` times for the spread —
and calls per second with W agents, in one run, on one machine, as ratios.

    .venv/bin/python bench/mcp_gateway.py --database postgres://postgres@127.0.0.1:5432/controlplane_mcpbench \
        --calls 300 --runs 3 --agents 1 4 16 --seconds 10

Parts, all real: our counting server on Streamable HTTP (stateless), the production server (gunicorn with
``--processes`` uvicorn workers, pooled connections) with the counting server as its downstream, PostgreSQL, and the
official MCP Python client. Each agent keeps one connection (ClientSession) and calls ``create_record`` with a new
name every time, so every gateway call is a new effect: prepare, dispatch intent, downstream call, record — three
transactions around the call. "Replay" repeats one call: the answer from the ledger, no downstream call.
Writes bench/results/mcp-gateway-<timestamp>.json and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import anyio
import httpx2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from history import fresh_database  # noqa: E402 - after the path is set


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)


async def _interleaved(
    direct: str, gateway: str, token: str, calls: int, tag: str
) -> dict[str, dict[str, list[float]]]:
    """Direct and through-the-gateway calls interleaved one by one on two open connections (the machine's load
    falls on both alike): a read-only call (``count``), a new effect (``create_record``, a new name each time) and a
    replay (the same effect again: answered from the ledger). Milliseconds per call."""
    from mcp.client.session import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    times: dict[str, dict[str, list[float]]] = {
        kind: {"direct": [], "gateway": []} for kind in ("read", "effect", "replay")
    }
    async with (
        httpx2.AsyncClient(timeout=60) as plain,
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as authed,
        streamable_http_client(direct, http_client=plain) as (dr, dw, *_),
        streamable_http_client(gateway, http_client=authed) as (gr, gw, *_),
        ClientSession(dr, dw) as d,
        ClientSession(gr, gw) as g,
    ):
        await d.initialize()
        await g.initialize()
        await g.call_tool("rec__create_record", {"name": f"{tag}-replayed"})
        for i in range(calls):
            for kind, tool, arguments in (
                ("read", "count", {}),
                ("effect", "create_record", {"name": f"{tag}-{i}"}),
                ("replay", "create_record", {"name": f"{tag}-replayed"}),
            ):
                for side, session, name in (("direct", d, tool), ("gateway", g, f"rec__{tool}")):
                    if kind == "replay" and side == "direct":
                        continue
                    started = time.perf_counter()
                    result = await session.call_tool(name, arguments)
                    times[kind][side].append((time.perf_counter() - started) * 1000)
                    assert not result.is_error, result
    return times


async def _throughput(endpoints: list[tuple[str, str | None]], seconds: float) -> int:
    """Calls completed by len(endpoints) agents, each on its own connection, in ``seconds``."""
    done = 0
    deadline = time.monotonic() + seconds

    async def agent(index: int, endpoint: str, token: str | None) -> None:
        nonlocal done
        from mcp.client.session import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        headers = {"Authorization": f"Bearer {token}"} if token else {}
        tool = "rec__create_record" if token else "create_record"
        async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
            async with streamable_http_client(endpoint, http_client=http) as (read, write, *_):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    n = 0
                    while time.monotonic() < deadline:
                        result = await session.call_tool(tool, {"name": f"tp-{index}-{n}"})
                        assert not result.is_error, result
                        n += 1
                        done += 1

    async with anyio.create_task_group() as tg:
        for index, (endpoint, token) in enumerate(endpoints):
            tg.start_soon(agent, index, endpoint, token)
    return done


def _claims(url: str, operator: str, workers: list[tuple[str, str]]) -> list[str]:
    """One task claimed by each worker: its attempt id."""
    import httpx

    attempts = []
    for name, token in workers:
        task = httpx.post(
            f"{url}/api/v1/tasks",
            json={"node_id": "bench", "input": {"w": name}},
            headers={"Authorization": f"Bearer {operator}"},
        ).json()
        claim = httpx.post(
            f"{url}/api/v1/tasks/{task['task_id']}/claim",
            json={"owner_id": name, "scheduler_epoch": 1, "ttl_seconds": 300},
            headers={"Authorization": f"Bearer {token}"},
        ).json()
        attempts.append(claim["attempt_id"])
    return attempts


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--database", required=True)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--agents", type=int, nargs="*", default=[1, 4, 16])
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3, help="interleaved latency runs, for their spread")
    args = parser.parse_args()

    fresh_database(args.database)
    os.environ.update(DATABASE_URL=args.database, DJANGO_SETTINGS_MODULE="controlplane.settings")
    import django

    django.setup()
    from django.core.management import call_command

    from claims.services import namespace_create, token_issue
    from deploy.topology import AppServer, free_port

    call_command("migrate", "--no-input", verbosity=0)
    operator = token_issue(name="bench-operator", role="operator")
    if (
        not __import__("claims.models", fromlist=["Namespace"])
        .Namespace.objects.filter(name="default")
        .exists()
    ):
        namespace_create(principal=operator.principal, name="default")
    workers = [
        (f"agent-{i}", token_issue(name=f"agent-{i}", role="worker").token)
        for i in range(max(args.agents, default=1))
    ]

    run_dir = Path(tempfile.mkdtemp(prefix="mcp-bench-"))
    port = free_port()
    counting = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "tests/gateway/counting_server.py"),
            "--ledger",
            str(run_dir / "ledger.jsonl"),
        ]
        + ["--port", str(port)],
        stdout=open(run_dir / "counting.log", "w"),  # noqa: SIM115 - the process keeps it
        stderr=subprocess.STDOUT,
    )
    direct = f"http://127.0.0.1:{port}/mcp"
    downstream = {"name": "counting", "prefix": "rec", "url": direct, "call_timeout_seconds": 30}
    env = {
        **os.environ,
        "DATABASE_URL": args.database,
        "DATABASE_POOL": "true",
        "API_RATE_LIMIT": "",
        "MCP_DOWNSTREAMS": json.dumps([downstream]),
        "MCP_TOOL_RULES": json.dumps([{"downstream": "counting", "tool": "count", "kind": "READ_ONLY"}]),
    }
    server = AppServer(run_dir, env, processes=args.processes).start()
    try:
        time.sleep(1)
        attempts = _claims(server.url, operator.token, workers)
        gateway = [f"{server.url}/mcp/attempts/{a}" for a in attempts]
        anyio.run(_interleaved, direct, gateway[0], workers[0][1], 20, "warm")
        runs = []
        for run in range(args.runs):
            measured = anyio.run(_interleaved, direct, gateway[0], workers[0][1], args.calls, f"run{run}")
            runs.append(
                {
                    kind: {
                        side: {
                            "p50": _pct(v, 0.5),
                            "p99": _pct(v, 0.99),
                            "mean": round(statistics.mean(v), 2),
                        }
                        for side, v in sides.items()
                        if v
                    }
                    | (
                        {
                            "added": {
                                q: round(_pct(sides["gateway"], f) - _pct(sides["direct"], f), 2)
                                for q, f in (("p50", 0.5), ("p99", 0.99))
                            }
                        }
                        if sides["direct"]
                        else {}
                    )
                    for kind, sides in measured.items()
                }
            )
        throughput = {}
        for w in args.agents:
            d = anyio.run(_throughput, [(direct, None)] * w, args.seconds)
            g = anyio.run(_throughput, [(gateway[i], workers[i][1]) for i in range(w)], args.seconds)
            throughput[w] = {"direct": round(d / args.seconds, 1), "gateway": round(g / args.seconds, 1)}
    finally:
        server.stop()
        counting.terminate()

    result = {
        "at": datetime.now(UTC).isoformat(),
        "calls": args.calls,
        "processes": args.processes,
        "runs": runs,
        "calls_per_second": throughput,
    }
    out = ROOT / "bench/results" / f"mcp-gateway-{datetime.now(UTC):%Y%m%dT%H%M%SZ}.json"
    out.write_text(json.dumps(result, indent=1))
    print("| run | call | direct p50 | gateway p50 | added p50 | added p99 |\n|---|---|---|---|---|---|")
    for n, run in enumerate(runs, 1):
        for kind in ("read", "effect"):
            row = run[kind]
            print(
                f"| {n} | {kind} | {row['direct']['p50']} | {row['gateway']['p50']} | {row['added']['p50']} | "
                f"{row['added']['p99']} |"
            )
        print(f"| {n} | replay | — | {run['replay']['gateway']['p50']} | — | — |")
    if throughput:
        print("\n| agents | direct calls/s | gateway calls/s | ratio |\n|---|---|---|---|")
    for w, row in throughput.items():
        print(f"| {w} | {row['direct']} | {row['gateway']} | {row['gateway'] / row['direct']:.2f} |")
    print(f"\n{out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
