"""The legacy-table soak drill (issue 34, point 8): the example application's table, at least 8 last-write-wins
workers with the stale-overwrite injector and a ground truth kept apart from the control plane, new rows inserted all
along, for --minutes, in one mode (observe: the workers write their table; proxy: they call /api/legacy) against the
legacy database LEGACY_DATABASE_URL names (PostgreSQL with wal_level = logical, or MySQL/MariaDB — with its binary
log on, the binlog reader). In observe mode the observer runs as its own process (``manage.py legacy_observe``):
killed with SIGKILL and restarted twice, and paused (SIGSTOP) once for more than three leases. Then: V1_READS →
V1_WRITES with claim.v1 workers (old binaries still at it: refused in proxy mode, DIRECT_WRITE in observe mode), a
forced rollback to SHADOW, and a re-advance with the legacy workers again.

Checked, and the run fails otherwise: the mismatches equal the ground truth's stale overwrites exactly (0 false, 0
missed: no other reason but the fence's and DIRECT_WRITE); every job legacy completed cleanly is committed in
claim.v1 by that worker; after the rollback their table equals claim.v1 in every mapped column of every row.
Recorded: the observer's lag (max, and beyond a lease), changes judged per second (overall and catching up) and its
CPU per change; in proxy mode the legacy API's rate and latency.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/controlplane_bench \\
    LEGACY_DATABASE_URL=postgres://postgres@127.0.0.1:5433/controlplane_observe \\
        .venv/bin/python bench/legacy_soak.py --mode observe --minutes 30

The control plane's database must be migrated; the legacy database must exist. Results are printed and written to
bench/results/legacy-soak-<database>-<mode>-<timestamp>.json. tests/rollout/test_legacy_soak.py runs a short one.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
from examples.legacy_jobs.app import MAPPING as EXAMPLE  # noqa: E402 - after the checkout is on the path

MAPPING = {**EXAMPLE, "input": "payload"}


def configure(namespace: str, legacy_url: str | None = None) -> dict[str, str]:
    """The environment a run (and its observer process) needs: the adapter over the example table, its queue mapped
    to ``namespace``, jobs run in place (the import on entering SHADOW)."""
    url = legacy_url or os.environ["LEGACY_DATABASE_URL"]
    mapping = {**MAPPING, "namespace_map": {"soak": namespace}}
    if url.startswith("mysql"):
        mapping["changed"] = "changed_at"
    values = {
        "LEGACY_DATABASE_URL": url,
        "ROLLOUT_LEGACY_STORE": "rollout.legacy_table.TableLegacyStore",
        "ROLLOUT_LEGACY_TABLE": json.dumps(mapping),
        "CELERY_TASK_ALWAYS_EAGER": "true",
        "LEGACY_POLL_MARGIN_SECONDS": "0.3",
    }
    os.environ.update(values)
    return values


class Http:
    """A worker's HTTP client, in process (DRF's test client with its own token)."""

    def __init__(self, token: str):
        from rest_framework.test import APIClient

        self.client = APIClient()
        self.client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        self.latencies: list[float] = []

    def post(self, path: str, json: dict[str, Any]):
        started = time.perf_counter()
        answer = self.client.post(path, json, format="json")
        self.latencies.append(time.perf_counter() - started)
        return answer


class Observer:
    """``manage.py legacy_observe`` as its own process, killed, restarted and paused on purpose."""

    def __init__(self, env: dict[str, str]):
        import tempfile

        self.env, self.proc, self.cpu = env, None, 0.0
        self.log = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: nobody reads it while it runs
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "legacy_observe",
                "--interval",
                "0.1",
                "--limit",
                "500",
            ],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=self.log,
            text=True,
        )

    def _cpu(self) -> float:
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, IndexError):
            return 0.0

    def kill(self) -> None:
        self.cpu += self._cpu()
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def pause(self, seconds: float) -> None:
        self.proc.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> str:
        self.cpu += self._cpu()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.seek(0)
        return self.log.read()


def _db_url(alias: str) -> str:
    from django.db import connections

    db = connections[alias].settings_dict
    scheme = "postgres" if connections[alias].vendor == "postgresql" else "mysql"
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return f"{scheme}://{db['USER']}{password}@{db['HOST'] or '127.0.0.1'}:{db['PORT']}/{db['NAME']}"


def soak(**kwargs: Any) -> dict[str, Any]:
    """One soak (``_soak``'s arguments); its observer process never outlives it, whatever happens."""
    running: list[Observer] = []
    try:
        return _soak(running=running, **kwargs)
    finally:
        for observer in running:
            if observer.proc is not None and observer.proc.poll() is None:
                observer.proc.kill()
                observer.proc.wait(10)


def _soak(
    *,
    running: list[Any],
    mode: str,
    seconds: float,
    namespace: str,
    legacy_alias: str = "legacy",
    workers: int = 8,
    lease: float = 1.0,
    stale_every: int = 5,
    feed_per_second: float = 4.0,
    observer_env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """One soak; the Django settings already configured (``configure``). Raises AssertionError on a false or missed
    mismatch or a row unequal after the rollback; returns the figures."""
    from django.db import connections

    from claims import services as core
    from claims.models import Task
    from examples.legacy_jobs.app import SCHEMA, Truth, TruthfulProxyWorker, TruthfulWorker, run_with_truth
    from rollout.models import LegacyImport, Mismatch, ObserverPosition, WriteBackDifference
    from rollout.services import observers, stages, state
    from tests.support.legacy_db import Their, connect, forget_observer

    their = Their(legacy_alias)
    dialect = their.dialect
    forget_observer(their)
    their.sql("DROP TABLE IF EXISTS jobs")
    their.sql(SCHEMA[dialect])
    if dialect == "postgresql":
        their.sql("ALTER TABLE jobs REPLICA IDENTITY FULL")
    counter = {"n": 0}

    def insert(count: int) -> None:
        rows = []
        for _ in range(count):
            counter["n"] += 1
            rows.append(f"{namespace}-{counter['n']:07d}")  # task ids are global: this run's own
        their.sql(
            "INSERT INTO jobs (job_id, queue, payload) VALUES " + ", ".join(["(%s, 'soak', %s)"] * len(rows)),
            [v for key in rows for v in (key, json.dumps({"job": key}))],
        )

    insert(200)
    oncall = core.principal_ensure(name="soak-oncall", role="oncall")
    state.namespace_create(principal=oncall, name=namespace, stage="LEGACY", min_protocol="legacy")
    observer = None
    if mode == "observe":
        observers.setup()
        env = {**os.environ, **(observer_env or {})}
        if observer_env is None:
            env.update({"DATABASE_URL": _db_url("default"), "LEGACY_DATABASE_URL": _db_url(legacy_alias)})
        observer = Observer(env)
        running.append(observer)
    began = time.monotonic()
    judged_before = (
        ObserverPosition.objects.filter(name=observers.position_name()).first().judged
        if observer is not None
        else 0
    )  # a position outlives runs

    def advance(to: str) -> None:
        stages.advance(principal=oncall, namespace=namespace, to_stage=to, reason="soak", override=True)

    advance("SHADOW")
    imported = LegacyImport.objects.filter(namespace=namespace).order_by("-id").first()
    truth, stop = Truth(), threading.Event()
    https: list[Http] = []

    def legacy_pool(prefix: str) -> list[Any]:
        pool = []
        for i in range(workers):
            name = f"{prefix}-{i}"
            if mode == "observe":
                pool.append(
                    TruthfulWorker(
                        lambda: connect(legacy_alias),
                        dialect,
                        name,
                        ttl=lease,
                        truth=truth,
                        margin=0.4 * lease,
                    )
                )
            else:
                http = Http(core.token_issue(name=name, role="worker").token)
                https.append(http)
                pool.append(
                    TruthfulProxyWorker(
                        http,
                        name,
                        lease,
                        lambda: connect(legacy_alias),
                        dialect,
                        truth=truth,
                        margin=0.8 * lease,
                    )
                )
        return pool

    def run_pool(pool: list[Any], until: float) -> None:
        stop.clear()
        threads = [
            threading.Thread(
                target=run_with_truth,
                args=(w, "soak", stop),
                kwargs={"stale_every": stale_every, "work": 0.15},
                daemon=True,
            )
            for w in pool
        ]
        feeder_stop = threading.Event()

        def feed() -> None:
            while not feeder_stop.wait(1.0 / feed_per_second):
                insert(1)

        feeder = threading.Thread(target=feed, daemon=True)
        for thread in [*threads, feeder]:
            thread.start()
        deadline = time.monotonic() + until
        plan = (
            [(0.2, "kill"), (0.45, "kill"), (0.7, "pause")]
            if observer is not None and until > 10 * lease
            else []
        )
        started = time.monotonic()
        for share, act in plan:
            while time.monotonic() - started < share * until:
                time.sleep(0.5)
                sample()
            if act == "kill":
                observer.kill()
                time.sleep(2 * lease)
                observer.start()
            else:
                observer.pause(3.5 * lease)
        while time.monotonic() < deadline:
            time.sleep(0.5)
            sample()
        stop.set()
        feeder_stop.set()
        for thread in [*threads, feeder]:
            thread.join(30)

    samples: list[dict[str, Any]] = []
    slowest = {"behind": 0.0}

    def sample() -> None:
        position = ObserverPosition.objects.filter(name=observers.position_name()).first()
        if position is None:
            return
        behind = position.behind_seconds or 0.0
        slowest["behind"] = max(slowest["behind"], behind)
        samples.append({"t": round(time.monotonic() - began, 1), "judged": position.judged, "behind": behind})
        if len(samples) % 20 == 0:
            print(
                f"{samples[-1]['t']:7.1f} s  judged {position.judged - judged_before:7d}  behind {behind:6.2f} s",
                flush=True,
            )

    def caught_up() -> float:
        """Wait until the observer has judged every change there is; returns the seconds it took."""
        if observer is None:
            return 0.0
        started, last, still = time.monotonic(), -1, 0
        while time.monotonic() - started < 600:
            position = ObserverPosition.objects.get(name=observers.position_name())
            settled = position.judged == last and not position.behind_seconds
            still = still + 1 if settled else 0
            if still >= 4:  # two seconds with nothing new judged and nothing behind
                return time.monotonic() - started
            last = position.judged
            time.sleep(0.5)
        raise AssertionError("the observer never caught up")

    def check_truth(phase: str) -> dict[str, Any]:
        stale = Counter(truth.stale())
        found = Counter(
            (m.task_id, m.legacy["owner_id"])
            for m in Mismatch.objects.filter(namespace=namespace, reason="STALE_COMMIT_ACCEPTED")
        )
        others = Counter(
            Mismatch.objects.filter(namespace=namespace)
            .exclude(reason__in=["STALE_COMMIT_ACCEPTED", "DIRECT_WRITE", "FENCE_UNSEEN_BY_LEGACY"])
            .values_list("reason", flat=True)
        )
        clean = truth.clean()
        committed = dict(
            Task.objects.filter(pk__in=list(clean), state="COMMITTED").values_list("task_id", "owner_id")
        )
        unfinished = sorted(job for job, worker in clean.items() if committed.get(job) != worker)
        figures = {
            "phase": phase,
            "completes": len(truth.completes),
            "stale_overwrites": sum(stale.values()),
            "mismatches_found": sum(found.values()),
            "false": sum((found - stale).values()) + sum(others.values()),
            "missed": sum((stale - found).values()),
            "other_reasons": dict(others),
            "clean_jobs_unfinished_in_claim_v1": len(unfinished),
        }
        assert figures["false"] == 0 and figures["missed"] == 0, (
            figures,
            found - stale,
            stale - found,
            others,
        )
        assert not unfinished, unfinished[:10]
        assert stale, "the injector made no stale overwrite: the soak proves nothing"
        return figures

    # --- SHADOW: the legacy pool with the injector, the observer killed twice and paused once -----------------
    shadow_seconds = 0.8 * seconds
    run_pool(legacy_pool("old"), shadow_seconds)
    catch_up = caught_up()
    judged_after_shadow = (
        ObserverPosition.objects.get(name=observers.position_name()).judged - judged_before if observer else 0
    )
    first = check_truth("shadow")

    # --- V1_READS → V1_WRITES: claim.v1 decides; old binaries still at it; then a forced rollback -----------------
    advance("V1_READS")
    advance("V1_WRITES")
    new = core.token_issue(name="soak-v1", role="worker")
    v1 = Http(new.token)
    from claims.digest import digest
    from claims.models import Namespace

    committed_v1 = 0
    until = time.monotonic() + max(3.0, 0.05 * seconds)
    while time.monotonic() < until:
        ns = Namespace.objects.get(name=namespace)
        granted = v1.post(
            "/api/v1/claims",
            {
                "owner_id": "soak-v1",
                "scheduler_epoch": ns.scheduler_epoch,
                "ttl_seconds": 30,
                "namespace": namespace,
            },
        )
        if granted.status_code == 200 and granted.json().get("attempt_id"):
            claim = granted.json()
            done = v1.post(
                f"/api/v1/tasks/{claim['task_id']}/commit",
                {
                    "attempt_id": claim["attempt_id"],
                    "claim_generation": claim["claim_generation"],
                    "scheduler_epoch": claim["scheduler_epoch"],
                    "observed_cancel_generation": claim["cancel_generation"],
                    "input_digest": claim["input_digest"],
                    "result": {"by": "soak-v1"},
                    "result_digest": digest({"by": "soak-v1"}),
                },
            )
            committed_v1 += done.status_code == 200
    direct = 0
    insert(
        10
    )  # new work their application adds: taken by claim.v1 (adopted), or by an old binary not stopped
    time.sleep(1.0)
    old = legacy_pool("late")
    refused_old = 0
    for worker in old[:3]:  # old binaries that were not stopped
        job = worker.next_job("soak")
        if job is not None and worker.claim(job):
            worker.complete(job, {"by": worker.name, "late": True})
            direct += 1
        refused_old += worker.tally.refused.get("PROTOCOL_TOO_OLD", 0)
        worker.close()
    caught_up()
    rolled = stages.rollback(
        principal=oncall, namespace=namespace, to_stage="SHADOW", reason="soak", force=True
    )
    assert rolled.finished_at is not None, rolled.step
    rollback_id = rolled.pk
    rows_checked, unequal = _table_equals_claim_v1(their, namespace)
    assert not unequal, unequal[:10]
    written_over = WriteBackDifference.objects.filter(namespace=namespace).count()

    # --- the re-advance: claims resumed, V1_READS again, the legacy pool back for a while ------------------------
    core.namespace_resume(principal=oncall, namespace=namespace, reason="soak")
    advance("V1_READS")
    run_pool(legacy_pool("again"), 0.15 * seconds)
    caught_up()
    second = check_truth("after the re-advance")
    elapsed = time.monotonic() - began
    position = ObserverPosition.objects.filter(name=observers.position_name()).first()
    figures: dict[str, Any] = {
        "mode": mode,
        "database": dialect
        if dialect == "postgresql"
        else ("mysql-binlog" if observers.method() == "binlog" else "mysql"),
        "seconds": round(elapsed, 1),
        "legacy_workers": workers,
        "lease_seconds": lease,
        "rows_imported_on_entering_shadow": imported.read if imported else 0,
        "rows_inserted_later": counter["n"] - 200,
        "tasks": Task.objects.filter(namespace__name=namespace).count(),
        "truth": [first, second],
        "rollback": {
            "id": str(rollback_id) if rollback_id else None,
            "rows_checked": rows_checked,
            "rows_unequal": 0,
            "old_binary_writes_in_v1_writes": direct,
            "old_binary_calls_refused_in_v1_writes": refused_old,
            "direct_write_mismatches": Mismatch.objects.filter(
                namespace=namespace, reason="DIRECT_WRITE"
            ).count(),
            "completions_written_over": written_over,
            "claim_v1_commits_in_v1_writes": committed_v1,
        },
    }
    if observer is not None:
        err = observer.stop()
        judged = (position.judged if position else 0) - judged_before
        figures["observer"] = {
            "method": observers.method(),
            "killed_and_restarted": 2 if seconds * 0.8 > 10 * lease else 0,
            "paused_seconds": 3.5 * lease if seconds * 0.8 > 10 * lease else 0,
            "judged": judged,
            "judged_per_second_overall": round(judged / elapsed, 1),
            "judged_per_second_catching_up": _catching_up_rate(samples),
            "max_behind_seconds": round(slowest["behind"], 2),
            "behind_beyond_a_lease": slowest["behind"] > lease,
            "cpu_seconds": round(observer.cpu, 2),
            "cpu_ms_per_change": round(1000 * observer.cpu / max(judged, 1), 2),
            "catch_up_seconds_after_shadow": round(catch_up, 1),
            "judged_after_shadow": judged_after_shadow,
            "stderr_tail": err.strip().splitlines()[-3:],
        }
    else:
        latencies = sorted(x for http in https for x in http.latencies)
        figures["legacy_api"] = {
            "requests": len(latencies),
            "per_second": round(len(latencies) / elapsed, 1),
            "p50_ms": round(1000 * latencies[len(latencies) // 2], 1) if latencies else None,
            "p95_ms": round(1000 * latencies[int(len(latencies) * 0.95)], 1) if latencies else None,
        }
    connections[legacy_alias].close()
    return figures


def _catching_up_rate(samples: list[dict[str, Any]]) -> float | None:
    """Changes judged per second over the samples where the observer was behind (catching up after a kill or the
    pause): its throughput when there is work waiting."""
    best = None
    for a, b in zip(samples, samples[1:], strict=False):
        if a["behind"] and b["t"] > a["t"]:
            rate = (b["judged"] - a["judged"]) / (b["t"] - a["t"])
            best = rate if best is None else max(best, rate)
    return round(best, 1) if best is not None else None


def _table_equals_claim_v1(their: Any, namespace: str) -> tuple[int, list[Any]]:
    """Every mapped column of every row as claim.v1 has the task (committed → completed by its committer with its
    result; held by a live, unfenced attempt → that owner and expiry; else nothing)."""
    from claims import clock
    from claims.models import Task
    from tests.support.legacy_db import row

    now, unequal, checked = clock.now(), [], 0
    for task in Task.objects.filter(namespace__name=namespace).select_related("namespace"):
        owner, until, output, finished_by, _ = row(their, task.task_id)
        checked += 1
        if task.state == "COMMITTED":
            if (finished_by, output) != (task.owner_id, task.result):
                unequal.append((task.task_id, "completion", finished_by, output, task.owner_id, task.result))
            continue
        live = (
            task.state == "CLAIMED"
            and task.lease_expires_at > now
            and task.scheduler_epoch >= task.namespace.scheduler_epoch
        )
        want = (task.owner_id, task.lease_expires_at) if live else (None, None)
        have_until_ok = (until is None and want[1] is None) or (
            until is not None and want[1] is not None and abs((until - want[1]).total_seconds()) < 1
        )
        if owner != want[0] or not have_until_ok or (output, finished_by) != (None, None):
            unequal.append((task.task_id, task.state, owner, until, output, finished_by))
    return checked, unequal


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=["observe", "proxy"], required=True)
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--lease", type=float, default=None, help="seconds (default 1 observe, 2 proxy)")
    args = parser.parse_args()
    namespace = f"soak-{args.mode}-{datetime.now(UTC):%m%d%H%M%S}"
    configure(namespace)
    import django

    django.setup()
    lease = args.lease or (1.0 if args.mode == "observe" else 2.0)
    figures = soak(
        mode=args.mode, seconds=60 * args.minutes, namespace=namespace, workers=args.workers, lease=lease
    )
    figures["at"] = datetime.now(UTC).isoformat()
    print(json.dumps(figures, indent=2))
    out = (
        ROOT
        / "bench"
        / "results"
        / (f"legacy-soak-{figures['database']}-{args.mode}-{datetime.now(UTC):%Y%m%dT%H%M%S}.json")
    )
    out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
