"""HTTP worker loops for the benchmarks: W processes, each a worker with its own token and one keep-alive
connection, doing claim-next → inline commit cycles (two requests), or batched cycles (claim N, commit N in one
request each). Used by bench/sidebyside.py; runnable alone against a running server:

    python bench/http_client.py --url http://127.0.0.1:8000 --token-file tokens.txt --namespace ns --workers 4
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import time
from typing import Any


def digest(value: Any) -> str:
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _commit_body(claim: dict, result: Any) -> dict:
    return {
        "attempt_id": claim["attempt_id"],
        "scheduler_epoch": claim["scheduler_epoch"],
        "claim_generation": claim["claim_generation"],
        "observed_cancel_generation": claim["cancel_generation"],
        "input_digest": claim["input_digest"],
        "result": result,
        "result_digest": digest(result),
    }


def worker_loop(
    url: str, token: str, owner: str, namespace: str, seconds: float, batch: int, queue: Any
) -> None:
    import httpx

    latencies: list[float] = []
    handed: list[str] = []
    errors = 0
    headers = {"Authorization": f"Bearer {token}"}
    claim_body = {"owner_id": owner, "scheduler_epoch": 1, "ttl_seconds": 300, "namespace": namespace}
    cpu = time.process_time()
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            if batch <= 1:
                answer = http.post("/api/v1/claims", json=claim_body)
                if answer.status_code == 204:
                    break
                claim = answer.json()
                result = {"task": claim["task_id"]}
                done = http.post(f"/api/v1/tasks/{claim['task_id']}/commit", json=_commit_body(claim, result))
                errors += done.status_code != 200
                handed.append(claim["task_id"])
                latencies.append(time.perf_counter() - started)
                continue
            answer = http.post("/api/v1/claims/batch", json={**claim_body, "max_tasks": batch})
            if answer.status_code == 204:
                break
            claims = answer.json()["claims"]
            items = [{"task_id": c["task_id"], **_commit_body(c, {"task": c["task_id"]})} for c in claims]
            done = http.post("/api/v1/commits", json={"commits": items}).json()["results"]
            errors += sum(r["status"] != 200 for r in done)
            handed += [c["task_id"] for c in claims]
            elapsed = time.perf_counter() - started
            latencies += [elapsed] * len(claims)  # each task's cycle is the batch's
    queue.put({"latencies": latencies, "handed": handed, "errors": errors, "cpu": time.process_time() - cpu})


def run(url: str, tokens: list[tuple[str, str]], namespace: str, seconds: float, batch: int) -> dict:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=worker_loop, args=(url, token, owner, namespace, seconds, batch, queue))
        for owner, token in tokens
    ]
    for proc in procs:
        proc.start()
    outputs = [queue.get(timeout=seconds + 120) for _ in procs]
    for proc in procs:
        proc.join(30)
    latencies = sorted(lat for out in outputs for lat in out["latencies"])
    handed = [task for out in outputs for task in out["handed"]]

    def pct(q: float) -> float:
        return (
            latencies[min(len(latencies) - 1, round(q / 100 * (len(latencies) - 1)))] * 1000
            if latencies
            else 0.0
        )

    return {
        "tasks": len(handed),
        "rate": len(handed) / seconds,
        "p50_ms": pct(50),
        "p95_ms": pct(95),
        "errors": sum(out["errors"] for out in outputs),
        # the worker processes' own CPU (the HTTP client, JSON, digests), on the same cores as the server
        "client_cpu_s": sum(out["cpu"] for out in outputs),
        "handed_twice": len(handed) - len(set(handed)),
        "handed": handed,
    }
