"""The migration drill (issue 23, point 5): the example legacy application (examples/legacy_jobs) — its own table and
column names, workers that claim by ``UPDATE … WHERE locked_until < now()`` and complete last-write-wins — migrated
LEGACY → SHADOW → V1_READS → V1_WRITES, rolled back to SHADOW, and on to V1_ONLY while its workers run: against a
PostgreSQL cluster with wal_level = logical and against MariaDB, in observe mode (the workers write their table; the
control plane follows it) and in proxy mode (the workers call /api/legacy). Checked on the rows of both databases:
the stale overwrite (A16) is caught and the gate stays shut on it; from V1_WRITES old binaries are refused (proxy)
or their direct writes detected (observe); the rollback leaves their table matching claim.v1. The figures of each run
are printed (operations compared, mismatches by reason, the observer's lag and pace)."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest
from django.db import connections

from claims.models import Namespace, Task
from examples.legacy_jobs.app import DirectWorker, ProxyWorker, run
from rollout.models import ComparedOperation, LegacyEvent, Mismatch, ObserverPosition, RolloutState
from rollout.services import observers, stages
from tests.support.actors import make_actor
from tests.support.legacy_db import Their, connect, row, task_in_both, their_table_configured
from tests.support.processes import wait_for
from tests.support.races import run_in_thread

DRILLS = [
    (alias, mode)
    for alias in ("legacy_logical", "legacy_mysql")
    if alias in connections
    for mode in ("observe", "proxy")
] + [("legacy_binlog", "observe")] * (
    "legacy_binlog" in connections
)  # MariaDB's binlog: observe mode's reader
pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(
        transaction=True, databases=["default", *sorted({alias for alias, _ in DRILLS})]
    ),  # only the databases configured: LEGACY_MYSQL_URL alone once errored asking for legacy_logical
    pytest.mark.skipif(
        not DRILLS,
        reason="needs LEGACY_OBSERVE_PG_URL, LEGACY_MYSQL_URL or LEGACY_BINLOG_URL (.ci/run sets them)",
    ),
]
POOL, SCENARIO = "drill", "drill-a16"


class Http:
    """The legacy API as a worker's HTTP client sees it (the test client, a token of its own)."""

    def __init__(self, actor):
        self.actor = actor

    def post(self, path: str, json: dict[str, Any]):
        return self.actor.client.post(path, json, format="json")


def _worker(alias: str, mode: str, name: str, ttl: float = 3.0):
    dialect = connections[alias].vendor
    if mode == "observe":
        return DirectWorker(lambda: connect(alias), dialect, name, ttl)
    return ProxyWorker(Http(make_actor(name, "worker")), name, ttl, lambda: connect(alias), dialect)


class Loop:
    """Something run again and again in a thread of its own until stopped."""

    def __init__(self, step, pause: float = 0.05):
        self.stop = threading.Event()
        self.errors: list[BaseException] = []

        def loop():
            while not self.stop.is_set():
                try:
                    step()
                except Exception as exc:  # noqa: BLE001 - kept for the test to report
                    self.errors.append(exc)
                time.sleep(pause)

        self.thread, _ = run_in_thread(loop)

    def end(self) -> None:
        self.stop.set()
        self.thread.join(30)


def _advance(oncall, ns: str, to: str) -> None:
    answer = oncall.post(
        f"/namespaces/{ns}/rollout/advance", {"to_stage": to, "reason": "drill", "override": True}
    )
    assert answer.status_code == 200, answer.json()


@pytest.mark.parametrize(("alias", "mode"), DRILLS)
def test_the_migration_drill(alias, mode, operator, settings):
    their = Their(alias)
    their.sql("DROP TABLE IF EXISTS jobs")
    from examples.legacy_jobs.app import SCHEMA

    their.sql(SCHEMA[connections[alias].vendor])
    if connections[alias].vendor == "postgresql":
        their.sql("ALTER TABLE jobs REPLICA IDENTITY FULL")
        if their.sql(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", [settings.LEGACY_OBSERVE_SLOT]
        ):
            their.sql("SELECT pg_drop_replication_slot(%s)", [settings.LEGACY_OBSERVE_SLOT])
        their.sql("DROP PUBLICATION IF EXISTS claim_control_plane")
    settings.LEGACY_POLL_MARGIN_SECONDS = 0.3  # a write whose commit lags its changed_at is not skipped
    settings.LEGACY_DECISION_GRACE_SECONDS = 0
    oncall = make_actor("oscar-oncall", "oncall")
    mapping = {"changed": "changed_at"} if connections[alias].vendor == "mysql" else {}
    started = time.monotonic()
    with their_table_configured(alias, **mapping):
        for ns in (POOL, SCENARIO):
            assert operator.post("/namespaces", {"name": ns, "stage": "LEGACY"}).status_code == 201
        jobs = [task_in_both(operator, their, POOL) for _ in range(20)]
        scenario_job = task_in_both(operator, their, SCENARIO)
        observer = None
        if mode == "observe":
            observers.setup()
            observer = Loop(lambda: observers.once(limit=500), pause=0.05)
        feeder = Loop(
            lambda: jobs.append(task_in_both(operator, their, POOL)), pause=0.1
        )  # work keeps coming
        # The old pool's leases outlast any stall of a busy machine (its work takes 0.05 s): with 3 s, two CI runs saw
        # a pool lease run out mid-job and a genuine second STALE_COMMIT_ACCEPTED beside the one the drill injects.
        old = [_worker(alias, mode, f"old-{i}", ttl=15.0) for i in range(3)]
        stop = threading.Event()
        pool = [run_in_thread(lambda w=w: run(w, POOL, stop, work_seconds=0.05))[0] for w in old]
        try:
            for ns in (POOL, SCENARIO):
                _advance(oncall, ns, "SHADOW")
            time.sleep(1.0)

            # A16: a worker whose claim ran out completes after another took over — legacy keeps the last write
            stale, fresh = _worker(alias, mode, "stale-w", ttl=1), _worker(alias, mode, "fresh-w", ttl=30)

            def seen(operation: str, owner: str) -> None:
                """Observe mode: this write judged before the next — a polling observer sees only the states at its
                passes (its documented limit), so the drill gives it a pass per write."""
                if mode == "observe":
                    assert wait_for(
                        lambda: LegacyEvent.objects.filter(
                            task_id=scenario_job, operation=operation, owner_id=owner
                        ).exists()
                    )

            assert stale.claim(scenario_job)
            seen("claim", "stale-w")
            time.sleep(1.3)
            assert fresh.claim(scenario_job)
            seen("claim", "fresh-w")
            stale.complete(scenario_job, {"by": "stale-w"})
            seen("complete", "stale-w")
            fresh.complete(scenario_job, {"by": "fresh-w"})
            stale.close(), fresh.close()
            caught = wait_for(
                lambda: Mismatch.objects.filter(task_id=scenario_job, reason="STALE_COMMIT_ACCEPTED").exists()
            )
            assert caught, list(Mismatch.objects.values_list("reason", "task_id"))
            gate = stages.evaluate_gate(namespace=SCENARIO)
            assert gate is not None and not gate.holds and "mismatches await review" in gate.why

            _advance(oncall, POOL, "V1_READS")
            time.sleep(0.5)
            _advance(oncall, POOL, "V1_WRITES")
            new = make_actor("new-w", "worker")

            def new_worker_step():
                epoch = Namespace.objects.get(name=POOL).scheduler_epoch
                granted = new.claim_next(epoch=epoch, namespace=POOL)
                if granted.status_code == 200 and granted.json().get("attempt_id"):
                    new.commit(granted.json(), {"by": "new-w"}, inline=True)

            # the old pool first meets V1_WRITES alone (a claim.v1 worker started at once can take every new job
            # before an old one finds it), then the claim.v1 worker joins
            if mode == "proxy":
                assert wait_for(lambda: any(w.tally.refused.get("PROTOCOL_TOO_OLD") for w in old)), [
                    w.tally for w in old
                ]
            else:
                assert wait_for(
                    lambda: Mismatch.objects.filter(namespace=POOL, reason="DIRECT_WRITE").exists()
                )
            claim_v1 = Loop(new_worker_step, pause=0.02)
            time.sleep(0.5)
            stop.set()  # the runbook: stop the old pool
            for thread in pool:
                thread.join(30)
            feeder.end()
            time.sleep(0.5)
            claim_v1.end()
            assert not claim_v1.errors, claim_v1.errors

            rolled = oncall.post(
                f"/namespaces/{POOL}/rollout/rollback",
                {"to_stage": "SHADOW", "reason": "drill", "force": True},
            )
            assert rolled.status_code == 200, rolled.json()
            _matches_claim_v1(their, jobs)

            assert oncall.post(f"/namespaces/{POOL}/resume", {"reason": "drill"}).status_code == 200
            for to in ("V1_READS", "V1_WRITES", "V1_ONLY"):
                _advance(oncall, POOL, to)
            assert RolloutState.objects.get(namespace__name=POOL).stage == "V1_ONLY"
        finally:
            stop.set()
            feeder.end()
            if observer is not None:
                observer.end()
        elapsed = time.monotonic() - started
        if observer is not None:
            assert not observer.errors, observer.errors
        figures = _figures(alias, mode, elapsed, old)
        found = {reason: n for reason, n in figures["mismatches"].items() if reason != "DIRECT_WRITE"}
        if found != {"STALE_COMMIT_ACCEPTED": 1}:  # what was found, whole, for the failure's report
            shown = Mismatch.objects.exclude(reason="DIRECT_WRITE").values(
                "task_id", "namespace", "operation", "reason", "legacy", "v1", "at"
            )
            print("\nMISMATCHES " + json.dumps(list(shown), default=str))
        assert found == {"STALE_COMMIT_ACCEPTED": 1}, (
            found
        )  # the one injected (A16): nothing false, nothing missed
        print("\nDRILL " + json.dumps(figures))
    their.sql("DROP TABLE IF EXISTS jobs")


def _matches_claim_v1(their: Their, jobs: list[str]) -> None:
    """After the rollback, every mapped column of every row as claim.v1 has the task: committed → completed by its
    committer with claim.v1's canonical result; held by a live attempt → that owner and expiry, not completed;
    otherwise no owner, no expiry, no result, not completed — whatever old binaries wrote before (issue 34, 5)."""
    from claims import clock

    now = clock.now()
    for task in Task.objects.filter(pk__in=jobs).select_related("namespace"):
        owner, until, output, finished_by, _ = row(their, task.task_id)
        if task.state == "COMMITTED":
            assert (finished_by, output) == (task.owner_id, task.result), (task.task_id, finished_by, output)
            continue
        live = (
            task.state == "CLAIMED"
            and task.lease_expires_at > now
            and task.scheduler_epoch >= task.namespace.scheduler_epoch
        )
        if live:
            assert owner == task.owner_id and abs((until - task.lease_expires_at).total_seconds()) < 1, (
                task.task_id
            )
            assert (output, finished_by) == (None, None), (task.task_id, output, finished_by)
        else:
            assert (owner, until, output, finished_by) == (None, None, None, None), (
                task.task_id,
                owner,
                output,
            )


def _figures(alias: str, mode: str, elapsed: float, old) -> dict[str, Any]:
    reasons: dict[str, int] = {}
    for reason in Mismatch.objects.values_list("reason", flat=True):
        reasons[reason] = reasons.get(reason, 0) + 1
    position = ObserverPosition.objects.first()
    return {
        "database": alias,
        "mode": mode,
        "seconds": round(elapsed, 1),
        "compared": ComparedOperation.objects.count(),
        "agreed": ComparedOperation.objects.filter(agreed=True).count(),
        "mismatches": reasons,
        "observer_judged": position.judged if position else None,
        "observer_lag_bytes": position.lag_bytes if position else None,
        "observer_judged_per_second": round(position.judged / elapsed, 1) if position else None,
        "old_workers": [
            {"claimed": w.tally.claimed, "completed": w.tally.completed, "refused": w.tally.refused}
            for w in old
        ],
    }
