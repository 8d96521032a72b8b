"""An HTTP proxy in front of a live server that loses answers on purpose: the request reaches the server and is
decided there, and the connection then closes before the client reads a byte of the answer — as when an app server
or the database's leader dies right after a commit. For clients' retry tests in other languages (the TypeScript
client), where an in-process transport cannot be swapped in."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx


@contextmanager
def lossy_proxy(upstream: str, lose: Callable[[str, str], bool]) -> Iterator[tuple[str, list[str]]]:
    """A proxy to ``upstream``: ``lose(method, path)`` says whether this request's answer is lost. Yields the
    proxy's URL and the list of paths whose answers it lost."""
    lost: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}
            answer = httpx.request(
                self.command, upstream + self.path, content=body, headers=headers, timeout=60
            )
            if lose(self.command, self.path):
                lost.append(self.path)
                self.close_connection = True
                self.connection.shutdown(2)  # decided upstream; the client never reads the answer
                return
            self.send_response(answer.status_code)
            for name, value in answer.headers.items():
                if name.lower() not in (
                    "content-length",
                    "transfer-encoding",
                    "connection",
                    "content-encoding",
                ):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(answer.content)))
            self.end_headers()
            self.wfile.write(answer.content)

        do_GET = do_POST = _forward

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", lost
    finally:
        server.shutdown()
        server.server_close()
