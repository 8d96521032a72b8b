"""Our own downstream MCP server for the gateway's tests and benchmarks: every effect it performs is one line in a
ledger file (JSON lines, appended under a lock), so a test counts what really happened downstream.

    python tests/gateway/counting_server.py --ledger /tmp/ledger.jsonl            # stdio
    python tests/gateway/counting_server.py --ledger /tmp/ledger.jsonl --port 9100  # Streamable HTTP at /mcp

Tools: ``create_record`` (an effect; ``sleep_after`` seconds: it acts, then answers late — a timeout after the
effect; ``slow_once``: a file whose presence stalls this one call before it acts), ``find_record`` (read-only: the records of a name; isError when there is none), ``count`` (read-only),
``always_fails`` (isError; a ledger line per call, so how often it was reached is counted).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import time

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

parser = argparse.ArgumentParser()
parser.add_argument("--ledger", required=True)
parser.add_argument("--port", type=int, default=0)
args = parser.parse_args()

server = MCPServer("counting")


def _append(entry: dict) -> int:
    with open(args.ledger, "a+") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        n = sum(1 for _ in f) + 1
        f.write(json.dumps({**entry, "n": n, "pid": os.getpid(), "at": time.time()}) + "\n")
        f.flush()
        return n


def _records() -> list[dict]:
    try:
        with open(args.ledger) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


@server.tool(annotations=ToolAnnotations(destructiveHint=False, idempotentHint=False))
async def create_record(
    name: str, body: str = "", sleep_after: float = 0.0, sleep_before: float = 0.0, slow_once: str = ""
) -> str:
    """Create a record (one line in the ledger)."""
    if slow_once and os.path.exists(slow_once):
        os.remove(slow_once)  # this call only: it stalls before acting (a cancelled call never acts)
        await anyio.sleep(4)
    if sleep_before:
        await anyio.sleep(sleep_before)
    n = _append({"tool": "create_record", "name": name, "body": body})
    if sleep_after:
        await anyio.sleep(sleep_after)
    return f"created record {n} named {name}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def find_record(name: str) -> str:
    """The records of a name."""
    found = [r for r in _records() if r.get("name") == name]
    if not found:
        raise ValueError(f"no record named {name}")
    return json.dumps(found)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def count() -> int:
    """How many records there are."""
    return len(_records())


@server.tool()
async def always_fails(reason: str = "no", sleep: float = 0.0) -> str:
    """Refuses after ``sleep`` seconds (its refusal is definite: it did nothing). Each call is a ledger line with tool
    ``always_fails``, so a test counts how often it was reached."""
    _append({"tool": "always_fails", "name": "", "body": reason})
    await anyio.sleep(sleep)
    raise ValueError(f"refused: {reason}")


if __name__ == "__main__":
    if args.port:
        server.run(transport="streamable-http", host="127.0.0.1", port=args.port, stateless_http=True)
    else:
        server.run()
