"""A heterogeneous fleet in one process (issue 21's chaos scenario): waiting claimers filtered to nodes, batch
claimers of another node, clients that start a waiting claim and hang up, and a slow worker that outlives its lease —
each recording every request and answer with wall-clock timestamps (JSON lines) for the history checker.

    python tests/chaos/fleet.py URL TOKENS_JSON LOG SECONDS

TOKENS_JSON maps each member's name to its token; a member's role is in its name (``x0``, ``zb0``, ``gonex``,
``slow0``: waiting claimer of node x, batch claimer of node z, hang-up client of node x, slow worker of any node). Members run until
SECONDS have passed and then until nothing has been claimable for 3 s, so the queue drains.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from claims.digest import digest  # noqa: E402

WAIT = 10  # wait_seconds of every waiting claim
LEASE = 2


class Fleet:
    def __init__(self, url: str, tokens: dict[str, str], log_path: str, seconds: float):
        self.url, self.tokens = url, tokens
        self.log = open(log_path, "a", buffering=1)
        self.deadline = time.time() + seconds
        self.idle_since = time.time()
        self.rng = random.Random(21)

    def record(self, op: str, owner: str, started: float, **fields) -> None:
        line = {"op": op, "owner": owner, "t0": started, "t1": time.time(), **fields}
        self.log.write(json.dumps(line) + "\n")

    def granted(self, owner: str, started: float, claim: dict, **fields) -> None:
        ids = {"task_id": claim["task_id"], "attempt_id": claim["attempt_id"]}
        generation = {"generation": claim["claim_generation"], "epoch": claim["scheduler_epoch"]}
        self.record("claim", owner, started, status=200, outcome="CLAIMED", **ids, **generation, **fields)

    def done(self) -> bool:
        return time.time() > self.deadline and time.time() - self.idle_since > 3

    def client(self, owner: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url + "/api/v1",
            timeout=30,
            headers={"Authorization": f"Bearer {self.tokens[owner]}"},
        )

    async def commit(self, http: httpx.AsyncClient, owner: str, claim: dict) -> None:
        result = {"computed_on": claim["input_digest"], "by": owner, "generation": claim["claim_generation"]}
        body = {
            "attempt_id": claim["attempt_id"],
            "scheduler_epoch": claim["scheduler_epoch"],
            "claim_generation": claim["claim_generation"],
            "observed_cancel_generation": claim["cancel_generation"],
            "input_digest": claim["input_digest"],
            "result_digest": digest(result),
            "result": result,
        }
        ids = {"task_id": claim["task_id"], "attempt_id": claim["attempt_id"]}
        for attempt in range(3):
            if claim["fences"]:  # name the resources as read now (their revision moves with each commit)
                body["resources"] = []
                for key in sorted(claim["fences"]):
                    read = (await http.get(f"/resources/{key}")).json()
                    body["resources"].append(
                        {
                            "resource_key": key,
                            "incarnation": read["incarnation"],
                            "expected_revision": read["revision"],
                        }
                    )
            started = time.time()
            self.record("commit", owner, started, status=-1, outcome="SENT", **ids)
            answer = await http.post(f"/tasks/{claim['task_id']}/commit", json=body)
            fields = answer.json() if answer.content else {}
            if answer.status_code == 409 and fields.get("reason") == "RESOURCE" and attempt < 2:
                continue  # another task of the key committed between our read and our commit: read again
            self.record(
                "commit",
                owner,
                started,
                status=answer.status_code,
                outcome=fields.get("outcome", ""),
                reason=fields.get("reason", ""),
                generation=claim["claim_generation"],
                epoch=claim["scheduler_epoch"],
                **ids,
            )
            return

    async def waiter(self, owner: str, node_ids: list[str] | None, batch: bool) -> None:
        async with self.client(owner) as http:
            while not self.done():
                body: dict = {
                    "owner_id": owner,
                    "scheduler_epoch": 1,
                    "ttl_seconds": 30,
                    "namespace": "chaos",
                }
                body["wait_seconds"] = WAIT
                if node_ids:
                    body["node_ids"] = node_ids
                if batch:
                    body["max_tasks"] = 4
                started = time.time()
                answer = await http.post("/claims/batch" if batch else "/claims", json=body)
                if answer.status_code != 200:
                    self.record(
                        "claim",
                        owner,
                        started,
                        status=answer.status_code,
                        outcome="NONE",
                        wait=WAIT,
                        node_ids=node_ids,
                        batch=batch,
                    )
                    continue
                self.idle_since = time.time()
                claims = answer.json()["claims"] if batch else [answer.json()]
                for claim in claims:
                    self.granted(
                        owner, started, claim, wait=WAIT, node_ids=node_ids, batch=batch, healthy=True
                    )
                for claim in claims:
                    await asyncio.sleep(self.rng.uniform(0.1, 0.5))  # the work
                    await self.commit(http, owner, claim)

    async def slow(self, owner: str) -> None:
        """Claims with a 2 s lease, stalls 3 s (a GC pause, a SIGSTOP), then commits: refused, never accepted."""
        async with self.client(owner) as http:
            while time.time() < self.deadline:
                body = {"owner_id": owner, "scheduler_epoch": 1, "ttl_seconds": LEASE, "namespace": "chaos"}
                started = time.time()
                answer = await http.post("/claims", json=body)
                if answer.status_code != 200:
                    await asyncio.sleep(0.5)
                    continue
                claim = answer.json()
                self.granted(owner, started, claim, healthy=False)
                await asyncio.sleep(LEASE + 1.0)
                await self.commit(http, owner, claim)

    async def gone(self, owner: str, node_ids: list[str]) -> None:
        """Starts a waiting claim and hangs up on it after a moment; what it did receive it releases."""
        rng = random.Random(owner)
        while time.time() < self.deadline:
            body = {
                "owner_id": owner,
                "scheduler_epoch": 1,
                "ttl_seconds": LEASE,
                "namespace": "chaos",
                "node_ids": node_ids,
                "wait_seconds": 30,
            }
            started = time.time()
            async with self.client(owner) as http:
                try:
                    answer = await asyncio.wait_for(http.post("/claims", json=body), rng.uniform(0.2, 1.2))
                except TimeoutError:
                    self.record("claim", owner, started, status=0, outcome="HUNG_UP", node_ids=node_ids)
                    continue
                if answer.status_code == 200:
                    claim = answer.json()
                    self.granted(owner, started, claim, healthy=False)
                    release = {k: claim[k] for k in ("attempt_id", "claim_generation", "scheduler_epoch")}
                    await http.post(f"/tasks/{claim['task_id']}/release", json={**release, "owner_id": owner})

    async def run(self) -> None:
        members = []
        for name in self.tokens:
            if name.startswith("gone"):
                members.append(self.gone(name, [name[-1]]))
            elif name.startswith("slow"):
                members.append(self.slow(name))
            else:  # "x0": a waiting claimer of node x; "zb0": a batch claimer of node z
                members.append(self.waiter(name, [name[0]], batch=name[1] == "b"))
        await asyncio.gather(*members)


if __name__ == "__main__":
    url, tokens, log, seconds = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    asyncio.run(Fleet(url, tokens, log, seconds).run())
