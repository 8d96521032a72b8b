"""Our own downstream MCP server for the gateway's tests and benchmarks: every effect it performs is one line in a
ledger file (JSON lines, appended under a lock), so a test counts what really happened downstream.

    python tests/gateway/counting_server.py --ledger /tmp/ledger.jsonl            # stdio
    python tests/gateway/counting_server.py --ledger /tmp/ledger.jsonl --port 9100  # Streamable HTTP at /mcp
    … --port 9100 --stateful        # sessions on: an Mcp-Session-Id, state per session, lost when it restarts
    … --honour-key                   # one effect per idempotency key: a repeat of a key gets the first answer

Every ledger line carries the idempotency key the call came with (``_meta`` dev.claim-control-plane/idempotency_key
and, on HTTP, the ``Idempotency-Key`` header), so a test reads what reached the server.

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
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

parser = argparse.ArgumentParser()
parser.add_argument("--ledger", required=True)
parser.add_argument("--port", type=int, default=0)
parser.add_argument("--stateful", action="store_true")
parser.add_argument("--honour-key", action="store_true")
args = parser.parse_args()
KEY = "dev.claim-control-plane/idempotency_key"

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


def _keys(ctx: Context | None) -> dict:
    """The idempotency key as it arrived: in ``_meta`` and in the HTTP header."""
    if ctx is None:
        return {}
    meta = ctx.request_context.meta or {}
    headers = ctx.headers or {}
    return {"key": meta.get(KEY, ""), "header_key": headers.get("idempotency-key", "")}


def _seen(key: str) -> dict | None:
    """With --honour-key: the first record made under ``key`` (a repeat gets its answer, nothing new happens)."""
    if not (args.honour_key and key):
        return None
    return next((r for r in _records() if r.get("key") == key), None)


@server.tool(annotations=ToolAnnotations(destructiveHint=False, idempotentHint=False))
async def create_record(
    name: str,
    body: str = "",
    sleep_after: float = 0.0,
    sleep_before: float = 0.0,
    slow_once: str = "",
    act_after: float = 0.0,
    late_once: str = "",
    ctx: Context | None = None,
) -> str:
    """Create a record (one line in the ledger). ``act_after``: it ignores a cancellation and acts that many seconds
    later anyway (a downstream that acts after the caller's timeout); ``late_once``: a file whose presence makes
    this one call do that for 3 s (the calls after it act at once)."""
    if late_once and os.path.exists(late_once):
        os.remove(late_once)
        act_after = 3.0
    if slow_once and os.path.exists(slow_once):
        os.remove(slow_once)  # this call only: it stalls before acting (a cancelled call never acts)
        await anyio.sleep(4)
    if sleep_before:
        await anyio.sleep(sleep_before)
    keys = _keys(ctx)
    if act_after:
        with anyio.CancelScope(shield=True):
            await anyio.sleep(act_after)
            return _create(name, body, keys)
    answer = _create(name, body, keys)
    if sleep_after:
        await anyio.sleep(sleep_after)
    return answer


def _create(name: str, body: str, keys: dict) -> str:
    with open(args.ledger, "a+") as f:  # the key's check and the record under one lock
        fcntl.flock(f, fcntl.LOCK_EX)
        seen = _seen(keys.get("key") or keys.get("header_key", ""))
        if seen is not None:
            return f"created record {seen['n']} named {seen['name']}"
        f.seek(0)
        n = sum(1 for _ in f) + 1
        entry = {"tool": "create_record", "name": name, "body": body, **keys}
        f.write(json.dumps({**entry, "n": n, "pid": os.getpid(), "at": time.time()}) + "\n")
        f.flush()
    return f"created record {n} named {name}"


@server.tool()
async def long_task(name: str, seconds: float, every: float = 3.0, ctx: Context | None = None) -> str:
    """Works for ``seconds``, reporting progress every ``every`` seconds, then makes its record."""
    started = time.monotonic()
    while (done := time.monotonic() - started) < seconds:
        if ctx is not None:
            await ctx.report_progress(done, seconds, f"{done:.0f} of {seconds:.0f} s")
        await anyio.sleep(min(every, seconds - done))
    return _create(name, "long", _keys(ctx))


@server.tool()
def big_answer(name: str, size: int, ctx: Context | None = None) -> str:
    """Makes its record, then answers ``size`` bytes of text."""
    _create(name, "big", _keys(ctx))
    return "x" * size


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
async def always_fails(reason: str = "no", sleep: float = 0.0, ctx: Context | None = None) -> str:
    """Refuses after ``sleep`` seconds (its refusal is definite: it did nothing). Each call is a ledger line with tool
    ``always_fails``, so a test counts how often it was reached."""
    _append({"tool": "always_fails", "name": "", "body": reason, **_keys(ctx)})
    await anyio.sleep(sleep)
    raise ValueError(f"refused: {reason}")


if __name__ == "__main__":
    if args.port:
        server.run(
            transport="streamable-http", host="127.0.0.1", port=args.port, stateless_http=not args.stateful
        )
    else:
        server.run()
