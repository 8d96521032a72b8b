"""A small legacy job runner, the kind of system the control plane migrates (docs/adopting.md, the drill): its own
table with its own column names, and workers that

- claim by ``UPDATE jobs SET locked_by = me, locked_until = now() + ttl WHERE job_id = ? AND (locked_until IS NULL OR
  locked_until < now())`` — after the expiry anyone takes over;
- complete by ``UPDATE jobs SET output = ?, finished_by = me WHERE job_id = ?`` — no check of who holds the claim now:
  last write wins (acceptance case A16: a worker whose claim ran out overwrites the result of the one that took over).

Two ways to run a worker: ``DirectWorker`` writes the table itself (what a team has today; the control plane observes
it), ``ProxyWorker`` asks the control plane's legacy API instead (``/api/legacy``; the proxy mode). Plain DB-API and
HTTP: nothing of the control plane is imported.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

SCHEMA = {
    "postgresql": (
        "CREATE TABLE jobs (job_id varchar(64) PRIMARY KEY, queue text NOT NULL, payload text NOT NULL, "
        "locked_by text, locked_until timestamptz, output jsonb, finished_by text)"
    ),
    "mysql": (
        "CREATE TABLE jobs (job_id varchar(64) PRIMARY KEY, queue varchar(64) NOT NULL, payload text NOT NULL, "
        "locked_by varchar(200), locked_until datetime(6) NULL, output json, finished_by varchar(200), "
        "changed_at datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) ON UPDATE CURRENT_TIMESTAMP(6), "
        "INDEX jobs_changed_at (changed_at))"
    ),
}
NOW = {"postgresql": "clock_timestamp()", "mysql": "UTC_TIMESTAMP(6)"}
# What the control plane needs to know of it (ROLLOUT_LEGACY_TABLE): its names, not ours.
MAPPING = {
    "table": "jobs",
    "key": "job_id",
    "owner": "locked_by",
    "expires": "locked_until",
    "result": "output",
    "completed": "finished_by",
    "namespace_column": "queue",
}


@dataclass
class Tally:
    claimed: int = 0
    completed: int = 0
    refused: dict[str, int] = field(default_factory=dict)

    def refuse(self, word: str) -> None:
        self.refused[word] = self.refused.get(word, 0) + 1


class DirectWorker:
    """Today's binary: writes the table itself."""

    def __init__(self, connect: Callable[[], Any], dialect: str, name: str, ttl: float = 5.0):
        self.connect, self.dialect, self.name, self.ttl = connect, dialect, name, ttl
        self.tally = Tally()
        self._conn: Any = None

    def _sql(self, sql: str, params: list[Any]) -> Any:
        if self._conn is None:
            self._conn = self.connect()
        cursor = self._conn.cursor()
        cursor.execute(sql, params)
        return cursor

    def next_job(self, queue: str) -> str | None:
        now = NOW[self.dialect]
        row = self._sql(
            f"SELECT job_id FROM jobs WHERE queue = %s AND finished_by IS NULL AND (locked_until IS NULL OR "
            f"locked_until < {now}) ORDER BY job_id LIMIT 1",
            [queue],
        ).fetchone()
        return row[0] if row else None

    def claim(self, job: str, ttl: float | None = None) -> bool:
        now = NOW[self.dialect]
        micros = int((ttl or self.ttl) * 1_000_000)
        until = (
            f"{now} + INTERVAL %s MICROSECOND"
            if self.dialect == "mysql"
            else f"{now} + make_interval(secs => %s)"
        )
        span: Any = micros if self.dialect == "mysql" else micros / 1_000_000
        cursor = self._sql(
            f"UPDATE jobs SET locked_by = %s, locked_until = {until} "
            f"WHERE job_id = %s AND (locked_until IS NULL OR locked_until < {now})",
            [self.name, span, job],
        )
        got = cursor.rowcount == 1
        self.tally.claimed += got
        return got

    def complete(self, job: str, output: Any) -> bool:
        self._sql(
            "UPDATE jobs SET output = %s, finished_by = %s WHERE job_id = %s",
            [json.dumps(output), self.name, job],
        )
        self.tally.completed += 1
        return True

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class ProxyWorker:
    """The same binary pointed at the control plane's legacy API (proxy mode): the same verbs over HTTP."""

    def __init__(
        self,
        http: Any,
        name: str,
        ttl: float = 5.0,
        connect: Callable[[], Any] | None = None,
        dialect: str = "postgresql",
    ):
        self.http, self.name, self.ttl = http, name, ttl
        self.tally = Tally()
        self._finder = DirectWorker(connect, dialect, name) if connect else None

    def next_job(self, queue: str) -> str | None:
        return self._finder.next_job(queue) if self._finder else None

    def _call(self, job: str, verb: str, body: dict[str, Any]) -> bool:
        answer = self.http.post(f"/api/legacy/tasks/{job}/{verb}", json={"owner_id": self.name, **body})
        if answer.status_code == 200:
            return True
        self.tally.refuse(answer.json().get("outcome", str(answer.status_code)))
        return False

    def claim(self, job: str, ttl: float | None = None) -> bool:
        got = self._call(job, "claim", {"ttl_seconds": max(1, round(ttl or self.ttl))})
        self.tally.claimed += got
        return got

    def complete(self, job: str, output: Any) -> bool:
        done = self._call(job, "complete", {"result": output, "result_digest": _digest(output)})
        self.tally.completed += done
        return done

    def close(self) -> None:
        if self._finder:
            self._finder.close()


def _digest(value: Any) -> str:
    """The contract's digest (claim-v1.md §1): sha256 of the canonical JSON."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    return "sha256:" + hashlib.sha256(canonical).hexdigest()


def claimed(worker: Any, queue: str, stop: threading.Event) -> Iterator[str]:
    """The jobs ``worker`` claims until ``stop``, one at a time (a short pause whenever none is free); the worker is
    closed at the end."""
    try:
        while not stop.is_set():
            job = worker.next_job(queue)
            if job is None or not worker.claim(job):
                time.sleep(0.02)
                continue
            yield job
    finally:
        worker.close()


def run(worker: Any, queue: str, stop: threading.Event, work_seconds: float = 0.01) -> None:
    """A worker's loop until ``stop``: find a free job, claim it, work, complete it."""
    for job in claimed(worker, queue, stop):
        time.sleep(work_seconds * random.random())
        worker.complete(job, {"by": worker.name})


# --- a load with a ground truth: what really happened in the table, kept apart from the control plane ------------


@dataclass
class Truth:
    """Every complete written to the table and whether it was a stale overwrite — the writer no longer held the
    claim (another owner, or its own expiry passed) when it wrote — as the table itself said under the row's lock in
    the writing transaction. The control plane never sees this record: a shadow report is checked against it."""

    completes: list[tuple[str, str, bool]] = field(default_factory=list)  # (job, worker, stale)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, job: str, worker: str, stale: bool) -> None:
        with self.lock:
            self.completes.append((job, worker, stale))

    def stale(self) -> list[tuple[str, str]]:
        with self.lock:
            return sorted((job, worker) for job, worker, stale in self.completes if stale)

    def clean(self) -> dict[str, str]:
        """The jobs whose last complete was a clean one, with its writer: claim.v1 must have committed these."""
        last: dict[str, tuple[str, bool]] = {}
        with self.lock:
            for job, worker, stale in self.completes:
                last[job] = (worker, stale)
        return {job: worker for job, (worker, stale) in last.items() if not stale}


class TruthfulWorker(DirectWorker):
    """A last-write-wins worker whose completes are checked against the table, for the ground truth: a heartbeat
    moves the expiry while the claim is its own with ``margin`` seconds left; a complete locks the row, reads who
    holds it and whether the expiry has passed on the table's clock, writes, and records what it was. An honest
    complete gives up (writes nothing) unless ``margin`` seconds of its claim are left; a stale one (the injector's)
    writes whatever it finds — last write wins."""

    def __init__(self, *args: Any, truth: Truth, margin: float = 0.25, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.truth, self.margin = truth, margin

    def _later(self: Any, seconds: float) -> str:
        now = NOW[self.dialect]
        if self.dialect == "mysql":
            return f"{now} + INTERVAL {int(seconds * 1_000_000)} MICROSECOND"
        return f"{now} + make_interval(secs => {seconds!r})"

    def heartbeat(self, job: str) -> bool:
        cursor = self._sql(
            f"UPDATE jobs SET locked_until = {self._later(self.ttl)} WHERE job_id = %s AND locked_by = %s "
            f"AND locked_until > {self._later(self.margin)}",
            [job, self.name],
        )
        return cursor.rowcount == 1

    def holding(self: Any, job: str, name: str, margin: float, lock: str = "") -> tuple[bool, bool]:
        """Read from the table whether ``name``'s claim on ``job`` is stale (another holder, or its expiry passed
        on the table's clock) and whether ``margin`` seconds of it are left."""
        owner, live, roomy = self._sql(
            f"SELECT locked_by, locked_until > {NOW[self.dialect]}, locked_until > {TruthfulWorker._later(self, margin)} "
            f"FROM jobs WHERE job_id = %s {lock}",
            [job],
        ).fetchone()
        return owner != name or not live, roomy

    def complete_checked(self, job: str, output: Any, *, stale_ok: bool = False) -> bool:
        self._sql("BEGIN", [])
        try:
            stale, roomy = self.holding(job, self.name, self.margin, "FOR UPDATE")
            if not stale_ok and (stale or not roomy):
                self._sql("ROLLBACK", [])
                return False
            self._sql(
                "UPDATE jobs SET output = %s, finished_by = %s WHERE job_id = %s",
                [json.dumps(output), self.name, job],
            )
            self._sql("COMMIT", [])
        except BaseException:
            self._sql("ROLLBACK", [])
            raise
        self.truth.record(job, self.name, stale)
        self.tally.completed += 1
        return True


def run_with_truth(
    worker: TruthfulWorker, queue: str, stop: threading.Event, *, stale_every: int = 0, work: float = 0.3
) -> None:
    """A worker's loop: claim a free job, work ``work`` of its lease in two halves with a heartbeat between, then
    complete it (or give it up). Every ``stale_every``-th claim it is the stale-overwrite injector instead: it sleeps
    past its expiry (someone may take over) and completes anyway, last write wins."""
    for claims, job in enumerate(claimed(worker, queue, stop), start=1):
        if stale_every and claims % stale_every == 0:
            time.sleep(worker.ttl + 0.5)
            worker.complete_checked(job, {"by": worker.name, "stale": True}, stale_ok=True)
            continue
        time.sleep(worker.ttl * work * random.random())
        if not worker.heartbeat(job):
            continue
        time.sleep(worker.ttl * work * random.random())
        worker.complete_checked(job, {"by": worker.name})


class TruthfulProxyWorker(ProxyWorker):
    """The proxied binary (proxy mode) with the ground truth: before a complete it reads, from the table, who holds
    the claim and how much of it is left (the table is legacy's record in proxy mode; the worker never writes it). An
    honest complete goes ahead only with ``margin`` seconds left — wide enough that the request reaches legacy's
    decision before the expiry; the stale injector completes anyway, after its expiry."""

    def __init__(self, *args: Any, truth: Truth, margin: float = 0.8, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.truth, self.margin = truth, margin

    def heartbeat(self, job: str) -> bool:
        return self._call(job, "heartbeat", {"ttl_seconds": max(1, round(self.ttl))})

    def complete_checked(self, job: str, output: Any, *, stale_ok: bool = False) -> bool:
        assert self._finder is not None
        stale, roomy = TruthfulWorker.holding(self._finder, job, self.name, self.margin)
        if not stale_ok and (stale or not roomy):
            return False
        if not self.complete(job, output):
            return False
        self.truth.record(job, self.name, stale)
        return True
