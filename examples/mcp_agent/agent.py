"""A small agent whose tools go through the fenced MCP gateway (docs/mcp.md): it claims the next task with the worker
SDK, then calls two MCP tools through ``/mcp/attempts/{attempt_id}`` — the filesystem server's ``write_file`` (the
report) and a record-keeping server's ``create_record`` — and commits. Kill it half-way and start it again (or
another agent): after the lease runs out the new claim calls the same tools with the same arguments; the gateway
answers the call that already happened from its ledger and runs only the one that did not.

    python examples/mcp_agent/agent.py --url http://127.0.0.1:8000 --token $WORKER_TOKEN --owner agent-a \\
        --report-dir /srv/reports [--pause-after-first-tool 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

import httpx2
from claim_client import ControlPlane
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client


async def _tool(endpoint: str, token: str, name: str, arguments: dict) -> str:
    """One tool call on its own connection; a refusal (isError) stops the agent with its words."""
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        async with streamable_http_client(endpoint, http_client=http) as (read, write, *_):
            async with ClientSession(read, write) as session:
                await session.initialize()
                result = await session.call_tool(name, arguments)
    words = "\n".join(getattr(c, "text", "") for c in result.content)
    if result.is_error:
        raise SystemExit(f"{name} refused: {words}")
    return words


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--owner", required=True)
    parser.add_argument("--report-dir", required=True)
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--ttl", type=int, default=5)
    parser.add_argument("--pause-after-first-tool", type=float, default=0.0)
    parser.add_argument("--wait", type=int, default=20)
    args = parser.parse_args()

    with ControlPlane(args.url, args.token, owner_id=args.owner) as plane:
        epoch = plane.namespace(args.namespace)["scheduler_epoch"]
        claim = plane.claim_next(
            scheduler_epoch=epoch, ttl_seconds=args.ttl, namespace=args.namespace, wait_seconds=args.wait
        )
        if claim is None:
            print(json.dumps({"agent": args.owner, "claimed": None}))
            return 0
        endpoint = f"{args.url}/mcp/attempts/{claim.attempt_id}"
        customer = claim.input["customer"]
        report = os.path.join(args.report_dir, f"{customer}.md")
        wrote = asyncio.run(
            _tool(
                endpoint,
                args.token,
                "fs__write_file",
                {"path": report, "content": f"# Report for {customer}\n"},
            )
        )
        print(json.dumps({"agent": args.owner, "tool": "write_file", "answer": wrote}), flush=True)
        if args.pause_after_first_tool:
            time.sleep(args.pause_after_first_tool)  # where a worker dies in the demo
        recorded = asyncio.run(
            _tool(endpoint, args.token, "rec__create_record", {"name": f"report-{customer}", "body": report})
        )
        print(json.dumps({"agent": args.owner, "tool": "create_record", "answer": recorded}), flush=True)
        committed = plane.commit(claim, {"report": report, "record": recorded})
        print(json.dumps({"agent": args.owner, "committed": committed.result_commit_id}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
