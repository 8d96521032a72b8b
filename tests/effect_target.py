"""A real HTTP effect target for the tests: it records every call per Idempotency-Key, and can be told to
misbehave the ways real targets do — act and then drop the reply, act slowly past the caller's timeout, fail
with a 5xx, refuse with a 4xx. Tests assert its call counts: "zero second external calls" is counted here.

For the chaos runs it can also drop a random share of replies after acting (``drop_rate``), delay some paths
(``delays``), and fence direct calls on ``X-Claim-Generation`` (``fence_paths``): a call carrying an older
generation than one already acted on for its key is refused with 409 and does not act (kept in ``refused``).
Every call records when it arrived (``at``, wall clock)."""

from __future__ import annotations

import json
import random
import threading
import time
from collections import defaultdict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class EffectTarget:
    def __init__(self) -> None:
        self.calls: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.mode = "ok"  # ok | drop_reply | slow | error | refuse
        self.slow_seconds = 3.0
        self.drop_rate = 0.0
        self.delays: dict[str, float] = {}
        self.fence_paths: set[str] = set()
        # path → Event: a call to that path is recorded (the target has acted) and its reply waits for the event
        self.holds: dict[str, threading.Event] = {}
        self.refused: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self._rng = random.Random(7)
        self._lock = threading.Lock()
        target = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:  # /calls/<key>: what a worker asks when it reconciles
                key = self.path.rsplit("/", 1)[-1]
                body = json.dumps(
                    {"occurred": bool(target.calls.get(key)), "count": len(target.calls.get(key, []))}
                )
                self._reply(200, body)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                payload = json.loads(self.rfile.read(length) or b"null")
                key = self.headers.get("Idempotency-Key", "")
                generation = self.headers.get("X-Claim-Generation")
                call = {
                    "payload": payload,
                    "generation": generation,
                    "fences": self.headers.get_all("X-Fence-Token") or [],
                    "path": self.path,
                    "at": time.time(),
                }
                with target._lock:
                    acted = [int(c["generation"] or 0) for c in target.calls.get(key, [])]
                    if self.path in target.fence_paths and acted and int(generation or 0) < max(acted):
                        target.refused[key].append(call)
                        stale = True
                    else:
                        stale = False
                        first = not target.calls.get(key)
                        target.calls[key].append(call)
                    mode = target.mode
                    if mode == "ok" and target.drop_rate and target._rng.random() < target.drop_rate:
                        mode = "drop_reply"
                if stale:
                    self._reply(409, json.dumps({"error": "stale claim generation"}))
                    return
                time.sleep(target.delays.get(self.path, 0))
                hold = target.holds.get(self.path)
                if hold is not None:
                    hold.wait(30)
                if mode == "drop_reply":
                    self.close_connection = True  # acted, but the caller never hears back
                    return
                if mode == "slow":
                    time.sleep(target.slow_seconds)
                if mode == "error":
                    self._reply(503, "{}")
                elif mode == "refuse":
                    self._reply(422, "{}")
                else:
                    self._reply(201 if first else 200, json.dumps({"key": key, "replayed": not first}))

            def _reply(self, status: int, body: str) -> None:
                data = body.encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the caller went away (killed mid-call): the target has acted all the same

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> EffectTarget:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def count(self, key: str | None = None) -> int:
        if key is None:
            return sum(len(calls) for calls in self.calls.values())
        return len(self.calls.get(key, []))
