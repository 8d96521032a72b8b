"""The conformance runner's target (npm @modelcontextprotocol/conformance, its server scenarios' requirements): the
tools its ``tools-*`` scenarios call, on Streamable HTTP at /mcp, stateless — served directly and as the gateway's
downstream, so the two runs can be compared (tests/gateway/test_conformance.py).

    python tests/gateway/conformance_server.py --port 9300
"""

from __future__ import annotations

import argparse
import base64

import anyio
from mcp import types
from mcp.server.mcpserver import Context, MCPServer

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
args = parser.parse_args()

# A 1×1 red PNG and a tiny silent WAV.
PNG = base64.b64encode(
    bytes.fromhex(
        "89504e470d0a1a0a0000000d4948445200000001000000010802000000907753de0000000c4944415408d763f8cfc000000301"
        "0100c9fe92ef0000000049454e44ae426082"
    )
).decode()
WAV = base64.b64encode(
    b"RIFF"
    + (36 + 2).to_bytes(4, "little")
    + b"WAVEfmt "
    + (16).to_bytes(4, "little")
    + (1).to_bytes(2, "little")
    + (1).to_bytes(2, "little")
    + (8000).to_bytes(4, "little")
    + (16000).to_bytes(4, "little")
    + (2).to_bytes(2, "little")
    + (16).to_bytes(2, "little")
    + b"data"
    + (2).to_bytes(4, "little")
    + b"\x00\x00"
).decode()

server = MCPServer("conformance-target")


@server.tool(description="Returns simple text")
def test_simple_text() -> list[types.TextContent]:
    return [types.TextContent(type="text", text="This is a simple text response for testing.")]


@server.tool(description="Returns an image")
def test_image_content() -> list[types.ImageContent]:
    return [types.ImageContent(type="image", data=PNG, mimeType="image/png")]


@server.tool(description="Returns audio")
def test_audio_content() -> list[types.AudioContent]:
    return [types.AudioContent(type="audio", data=WAV, mimeType="audio/wav")]


def _resource(uri: str, mime: str, text: str) -> types.EmbeddedResource:
    return types.EmbeddedResource(
        type="resource", resource=types.TextResourceContents(uri=uri, mimeType=mime, text=text)
    )


@server.tool(description="Returns an embedded resource")
def test_embedded_resource() -> list[types.EmbeddedResource]:
    return [_resource("test://embedded-resource", "text/plain", "This is an embedded resource content.")]


@server.tool(description="Returns text, an image and a resource")
def test_multiple_content_types() -> list:
    return [
        types.TextContent(type="text", text="Multiple content types test:"),
        types.ImageContent(type="image", data=PNG, mimeType="image/png"),
        _resource("test://mixed-content-resource", "application/json", '{"test":"data","value":123}'),
    ]


@server.tool(description="Always fails")
def test_error_handling() -> str:
    raise ValueError("This tool intentionally returns an error for testing")


@server.tool(description="Reports progress")
async def test_tool_with_progress(ctx: Context) -> str:
    for step in (0, 50, 100):
        await ctx.report_progress(step, 100)
        await anyio.sleep(0.05)
    return "Progress reported"


@server.tool(description="Logs while it runs")
async def test_tool_with_logging(ctx: Context) -> str:
    for message in ("Tool execution started", "Tool processing data", "Tool execution completed"):
        await ctx.info(message)
        await anyio.sleep(0.05)
    return "Logged"


if __name__ == "__main__":
    server.run(transport="streamable-http", host="127.0.0.1", port=args.port, stateless_http=True)
