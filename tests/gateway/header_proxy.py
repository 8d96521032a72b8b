"""A forwarding proxy that adds a header: the conformance runner has no option for an Authorization header, and the
gateway wants a worker's token. Every request to it goes to ``--to`` (path replaced) with the header added; Host and
Origin pass unchanged, so the runner's DNS-rebinding checks reach the gateway as sent.

    python tests/gateway/header_proxy.py --port 9400 --to http://127.0.0.1:8000/mcp/attempts/<id> --token <worker token>
"""

from __future__ import annotations

import argparse

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--to", required=True)
parser.add_argument("--token", required=True)
args = parser.parse_args()

client = httpx.AsyncClient(timeout=60)


async def forward(request: Request) -> StreamingResponse:
    headers = [
        (k, v) for k, v in request.headers.items() if k.lower() not in ("content-length", "authorization")
    ]
    headers.append(("authorization", f"Bearer {args.token}"))
    upstream = client.build_request(request.method, args.to, headers=headers, content=await request.body())
    reply = await client.send(upstream, stream=True)
    passed = {
        k: v for k, v in reply.headers.items() if k.lower() not in ("content-length", "transfer-encoding")
    }
    return StreamingResponse(
        reply.aiter_raw(),
        status_code=reply.status_code,
        headers=passed,
        background=BackgroundTask(reply.aclose),
    )


app = Starlette(routes=[Route("/{path:path}", forward, methods=["GET", "POST", "DELETE"])])

if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")
