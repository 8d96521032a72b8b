"""PgQueuer and procrastinate doing claim + complete of no-op jobs, W worker processes for a fixed time, on the given
PostgreSQL — the queues a user would pick instead of a fenced control plane (bench/sidebyside.py runs them in the
same run as the control plane's paths). Installed from the project's ``bench`` extra. Neither fences anything: a
job whose worker stalls past its heartbeat is simply picked again.

Each queue lives in its own schema-less tables of the bench database; every level starts from a freshly filled
queue so nobody runs dry. Rates count jobs whose completion PostgreSQL recorded by the end of the run.
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import time
from datetime import timedelta
from typing import Any

# --- PgQueuer 1.6 (asyncpg) -----------------------------------------------------------------------------------


async def _pgq_prepare(dsn: str, jobs: int) -> None:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries

    conn = await asyncpg.connect(dsn)
    try:
        queries = Queries(AsyncpgDriver(conn))
        if await queries.schema_is_installed():
            await queries.uninstall()
        await queries.install()
        for start in range(0, jobs, 10_000):
            n = min(10_000, jobs - start)
            await queries.enqueue(["bench"] * n, [None] * n, [0] * n)
        await conn.execute(
            "ANALYZE"
        )  # as autovacuum would after a bulk load (the control plane's seed does too)
    finally:
        await conn.close()


async def _pgq_worker(dsn: str, seconds: float, batch: int) -> int:
    import asyncpg
    from pgqueuer import AsyncpgDriver, Queries, QueueManager

    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))
    done = 0

    @qm.entrypoint("bench")
    async def bench(job: Any) -> None:
        nonlocal done
        done += 1

    async def stop() -> None:
        await asyncio.sleep(seconds)
        qm.shutdown.set()

    stopper = asyncio.create_task(stop())
    await qm.run(
        batch_size=batch, dequeue_timeout=timedelta(seconds=1), log_aggregation_interval=timedelta(0)
    )
    stopper.cancel()
    await conn.close()
    return done


def _pgq_process(dsn: str, seconds: float, batch: int, queue: Any) -> None:
    queue.put(asyncio.run(_pgq_worker(dsn, seconds, batch)))


async def _pgq_completed(dsn: str) -> int:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval("SELECT count(*) FROM pgqueuer_log WHERE status = 'successful'")
    finally:
        await conn.close()


def run_pgqueuer(dsn: str, workers: int, seconds: float, batch: int, jobs: int) -> dict[str, Any]:
    asyncio.run(_pgq_prepare(dsn, jobs))
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_pgq_process, args=(dsn, seconds, batch, queue)) for _ in range(workers)]
    for proc in procs:
        proc.start()
    executed = sum(queue.get(timeout=seconds + 120) for _ in procs)
    for proc in procs:
        proc.join(30)
    completed = asyncio.run(_pgq_completed(dsn))
    return {"executed": executed, "completed": completed, "rate": completed / seconds}


# --- procrastinate 3.10 (psycopg) -------------------------------------------------------------------------------


def _app(dsn: str):
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="bench", queue="bench")
    def bench() -> None:
        return None

    return app, bench


def _procrastinate_prepare(dsn: str, jobs: int) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("DROP SCHEMA IF EXISTS procrastinate_bench CASCADE")
        exists = conn.execute("SELECT to_regclass('procrastinate_jobs') IS NOT NULL").fetchone()[0]
        if exists:
            conn.execute("DELETE FROM procrastinate_events; DELETE FROM procrastinate_jobs")
    app, bench = _app(dsn)
    with app.open():
        if not exists:
            app.schema_manager.apply_schema()
        for start in range(0, jobs, 5_000):
            bench.batch_defer(*[{} for _ in range(min(5_000, jobs - start))])
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ANALYZE procrastinate_jobs")


def _procrastinate_process(dsn: str, seconds: float, queue: Any) -> None:
    app, _ = _app(dsn)

    async def work() -> None:
        async with app.open_async():
            try:
                await asyncio.wait_for(
                    app.run_worker_async(
                        queues=["bench"], concurrency=1, wait=True, install_signal_handlers=False
                    ),
                    timeout=seconds,
                )
            except TimeoutError:
                pass

    asyncio.run(work())
    queue.put(0)


def run_procrastinate(dsn: str, workers: int, seconds: float, jobs: int) -> dict[str, Any]:
    import psycopg

    _procrastinate_prepare(dsn, jobs)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_procrastinate_process, args=(dsn, seconds, queue)) for _ in range(workers)]
    started = time.perf_counter()
    for proc in procs:
        proc.start()
    for _ in procs:
        queue.get(timeout=seconds + 120)
    for proc in procs:
        proc.join(30)
    elapsed = time.perf_counter() - started
    with psycopg.connect(dsn) as conn:
        completed = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
        ).fetchone()[0]
    return {"completed": completed, "rate": completed / seconds, "elapsed": elapsed}
