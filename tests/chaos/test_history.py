"""A Jepsen-style run, CI-sized: real worker processes against a real server on PostgreSQL, every request and
answer recorded with timestamps, faults injected mid-run, then the invariants checked over the whole history
and the database:

- at most one canonical commit per task (history and rows);
- claim generations strictly increase per task, in the order the grants were answered;
- no accepted commit carries an older (epoch, generation) than one accepted before it on the same task;
- every committed result was computed on the input digest current at commit;
- progress: healthy owners do commit;
- the recorded timelines, replayed against the Spin model of the rules (model/trace.pml), are explained.

Faults (named scenarios): a worker paused with SIGSTOP past its lease and resumed; a worker killed with SIGKILL
mid-run; the server's database connections terminated from PostgreSQL's side (pg_terminate_backend); an epoch
fence and resume mid-run. CHAOS_SECONDS (default 8) sets the run's length; docs/chaos.md has longer runs.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from django.db import connection

from claims.digest import digest
from claims.models import (
    Attempt,
    AuditEntry,
    DispatchIntent,
    Effect,
    EffectEvent,
    Namespace,
    Principal,
    StagedResult,
    Task,
    TaskEvent,
)
from claims.tasks import redeliver_dispatches
from oncall import services as fences
from oncall.models import FenceRequest
from oncall.tasks import fence_epoch, resend_fences
from rollout.models import DrainSnapshot, Rollback
from rollout.tasks import advance_rollback
from tests.support import trace
from tests.support.actors import ensure_default_namespace, make_actor
from tests.support.order import check_order
from tests.support.processes import FAST_RESEND_ENV, restart_postgres, running_server, wait_for
from tests.support.races import pg_deadlocks, row_locked
from tests.support.rollout import stage_history_replays, stage_of

ROOT = Path(__file__).resolve().parents[2]
SECONDS = float(os.environ.get("CHAOS_SECONDS", "8"))
TASKS = int(150 * max(1.0, SECONDS / 8))  # enough work for the whole run


@pytest.fixture
def server() -> Iterator[str]:
    with running_server() as url:
        yield url


def spawn_workers(
    url: str, workers: list, logs: list[Path], *extra: str, seconds: float = SECONDS
) -> list[subprocess.Popen]:
    """One chaos worker process per actor, each logging its history to its own file, for ``seconds``."""
    return [
        subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "chaos" / "worker.py"), url, w.token, w.name, "chaos"]
            + [str(log), str(seconds), *extra],
            cwd=ROOT,
        )
        for w, log in zip(workers, logs, strict=True)
    ]


def kill_mid(proc: subprocess.Popen, log: Path, op: str = "commit") -> str:
    """SIGKILL the worker while a ``commit`` or ``dispatch`` request of its is in flight (its log's last line is
    that op, SENT); returns what became of it — the server finishes or abandons it without the worker."""
    deadline, last = time.monotonic() + 10, {}
    while time.monotonic() < deadline:
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4000))
            # Only whole lines: the worker may be halfway through writing its last one (CI once read half a line).
            lines = f.read().decode(errors="replace").split("\n")[:-1]
        last = json.loads(lines[-1]) if len(lines) > 1 else {}
        if last.get("op") == op and last.get("outcome") == "SENT":
            break
        time.sleep(0.002)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)
    if last.get("op") != op or last.get("outcome") != "SENT":
        return "none in flight"
    time.sleep(0.5)
    if op == "dispatch":
        recorded = DispatchIntent.objects.filter(
            effect_id=last["effect_id"], attempt_id=last["attempt_id"]
        ).exists()
        return "the dispatch was recorded" if recorded else "the dispatch was not recorded"
    task = Task.objects.get(pk=last["task_id"])
    landed = task.state == "COMMITTED" and str(task.attempt_id) == last["attempt_id"]
    return "the commit landed" if landed else "the commit did not land"


def _history(paths: list[Path]) -> list[dict]:
    entries = []
    for path in paths:
        if path.exists():
            entries += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return sorted(entries, key=lambda e: e["t1"])


def check_invariants(
    logs: list[Path], *, revised: dict[str, dict] | None = None, min_commits: int = 10
) -> list[dict]:
    """The invariants over the recorded history and the rows; returns the history."""
    history = _history(logs)
    assert len(history) > 50, f"only {len(history)} operations recorded"

    # 1. at most one canonical commit per task — in the history and in the rows
    committed = defaultdict(set)
    for e in history:
        if e["op"] == "commit" and e["status"] == 200:
            committed[e["task_id"]].add(e["attempt_id"])
    assert all(len(attempts) == 1 for attempts in committed.values()), committed
    for task_id in committed:
        assert StagedResult.objects.filter(task_id=task_id, canonical=True).count() == 1

    # 2. generations strictly increase per task in real-time order: a grant answered before another grant's request
    #    was sent has the smaller generation, and no two grants share one (a client stopped between the server's
    #    answer and its own record may record an older grant after a newer one: only their requests overlap)
    grants = defaultdict(list)
    for e in history:
        if e["op"] == "claim" and e["status"] == 200:
            grants[e["task_id"]].append((e["t0"], e["t1"], e["generation"], e["attempt_id"]))
    for task_id, seen in grants.items():
        by_generation = {g: attempt for _, _, g, attempt in seen}
        assert len(by_generation) == len({attempt for *_, attempt in seen}), (task_id, seen)
        for _, answered, earlier, _ in seen:
            for sent, _, later, _ in seen:
                assert not (answered < sent and later <= earlier), (task_id, sorted(seen))

    # 3. no accepted commit older (epoch, generation) than one accepted before it on the same task
    accepted = defaultdict(list)
    for e in history:
        if e["op"] == "commit" and e["status"] == 200:
            accepted[e["task_id"]].append((e["epoch"], e["generation"]))
    assert all(seq == sorted(seq) for seq in accepted.values())

    # 4. every committed result was computed on the input digest current at commit
    for task in Task.objects.filter(namespace__name="chaos", state="COMMITTED"):
        assert task.result["computed_on"] == task.input_digest, task.task_id
    for task_id, new_input in (revised or {}).items():  # revisions accepted mid-run
        task = Task.objects.get(pk=task_id)
        assert task.state != "COMMITTED" or task.result["computed_on"] == digest(new_input), task_id

    # 5. progress: healthy owners commit
    # nothing acknowledged is lost: every 200 COMMITTED is the task's canonical commit in the rows
    for task_id, attempts in committed.items():
        row = Task.objects.get(pk=task_id)
        assert row.state == "COMMITTED" and str(row.attempt_id) in attempts, task_id
    assert len(committed) >= min_commits, f"only {len(committed)} commits in {SECONDS}s"

    # 6. a RENEWED answer is never followed by another attempt's grant before that expiry: every attempt a reclaim
    #    ended was past its last lease — the claim's, or the latest renew's — when the next attempt started
    for attempt in Attempt.objects.filter(namespace__name="chaos", end_reason="RECLAIMED"):
        leases = [
            datetime.fromisoformat(event.detail["lease_expires_at"])
            for event in TaskEvent.objects.filter(
                attempt_id=attempt.attempt_id, kind__in=["claimed", "reclaimed", "renewed"]
            )
        ]
        after = (
            Attempt.objects.filter(task_id=attempt.task_id, claim_generation=attempt.claim_generation + 1)
            .values_list("started_at", "scheduler_epoch")
            .first()
        )
        assert after is not None, attempt.attempt_id
        started, epoch = after
        assert epoch > attempt.scheduler_epoch or started >= max(leases), (
            f"task {attempt.task_id}: generation {attempt.claim_generation + 1} granted at {started}, "
            f"before generation {attempt.claim_generation}'s lease ran out ({max(leases)})"
        )

    # 7. the grant order (claim-v1.md §10; tests/support/order.py): no first grant while a READY task of a better
    #    priority waited, and each key's share within the bound (plus the reordering of 4 workers' batches of 3)
    order = check_order("chaos", slack=12)
    keys = Task.objects.filter(namespace__name="chaos").values("fairness_key").distinct().count()
    assert not order.priority_violations, order.priority_violations[:5]
    assert order.worst_excess <= 1e-9 and (order.windows_checked or keys < 2), (
        order
    )  # a fleet's tasks: one key
    print(
        f"\nORDER {order.grants} first grants in order; worst window {order.worst_excess:+.2f} against the bound"
    )

    # 8. trace validation: the run's timelines, replayed against the Spin model of the rules, are explained event
    #    by event (tests/support/trace.py)
    verdict = trace.assert_explained(_rows)
    print(f"\nTRACE {verdict.events} recorded events explained by model/trace.pml in {verdict.seconds:.2f} s")
    return history


def _rows(sql: str) -> list[tuple]:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


KEYS = (("tenant-a", 1), ("tenant-b", 2), ("tenant-c", 1))  # claim-v1.md §10: three keys sharing the queue


def create_tasks(operator, count: int, kinds: tuple[str, ...] = ("plain",)) -> list[str]:
    """The run's tasks: one in five urgent (priority 1), the rest priority 3, spread over three fairness keys."""
    return [
        operator.create(
            namespace="chaos",
            node_id=f"n{i % len(kinds)}",
            input={"i": i, "kind": kinds[i % len(kinds)]},
            priority=1 if i % 5 == 0 else 3,
            fairness_key=KEYS[i % 3][0],
            fairness_weight=KEYS[i % 3][1],
        ).json()["task_id"]
        for i in range(count)
    ]


def revise_one_in_flight(operator, n: int) -> tuple[str, dict] | None:
    """Revise the input of a task being worked on (a claimed one if any, else a ready one): the holder's commit,
    computed on the old input, must then be refused STALE_INPUT."""
    task = (
        Task.objects.filter(namespace__name="chaos", state="CLAIMED").order_by("?").first()
        or Task.objects.filter(namespace__name="chaos", state="READY").order_by("?").first()
    )
    if task is None:
        return None
    new_input = {"i": f"revised-{n}", "kind": "plain"}
    answer = operator.post(f"/tasks/{task.task_id}/input", {"input": new_input})
    return (task.task_id, new_input) if answer.status_code == 200 else None


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120 + SECONDS * 4)
def test_invariants_hold_over_a_history_with_pauses_kills_terminated_connections_and_a_fence(
    server, tmp_path
):
    """Scenario 1. Fault rounds of about 6 s, repeated while the run lasts (one at CI size): a worker paused with
    SIGSTOP past its 2 s lease; the server's database connections terminated from PostgreSQL's side while it is
    paused; it resumes; an in-flight task's input revised; another worker SIGKILLed while a commit request of its
    is in flight, and started again under the same identity (a restarted pod); an epoch fence and resume."""
    ensure_default_namespace()
    operator, oncall = make_actor("chaos-op", "operator"), make_actor("chaos-oncall", "oncall")
    operator.post("/namespaces", {"name": "chaos"})
    create_tasks(operator, TASKS)
    deadlocks_before, oncall_answers = pg_deadlocks(), []
    workers = [make_actor(f"chaos-w{i}", "worker") for i in range(4)]
    logs = [tmp_path / f"{w.name}.jsonl" for w in workers]
    end = time.monotonic() + SECONDS
    procs = spawn_workers(server, workers, logs)
    faults: dict[str, int] = defaultdict(int)
    revised: dict[str, dict] = {}
    rounds, rng = 0, random.Random(SECONDS)
    while rounds == 0 or time.monotonic() + 7 < end:
        rounds += 1
        time.sleep(min(1.2, SECONDS * 0.15))
        paused, killed = rng.sample(range(len(workers)), 2)
        os.kill(procs[paused].pid, signal.SIGSTOP)  # past its 2-second lease
        time.sleep(1.0)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            faults["server connections terminated"] += cursor.fetchone()[0]
        time.sleep(2.0)
        os.kill(procs[paused].pid, signal.SIGCONT)
        faults["SIGSTOP 3 s"] += 1
        if change := revise_one_in_flight(operator, rounds):
            revised[change[0]] = change[1]
            faults["input revised mid-flight"] += 1
        time.sleep(0.8)
        fate = kill_mid(procs[killed], logs[killed], "commit")
        faults[f"SIGKILL during a commit request ({fate})"] += 1
        log = tmp_path / f"{workers[killed].name}.{rounds}.jsonl"  # restarted under the same identity
        logs.append(log)
        procs[killed] = spawn_workers(
            server, [workers[killed]], [log], seconds=max(1, end - time.monotonic())
        )[0]
        oncall_answers.append(
            oncall.post("/namespaces/chaos/fence", {"reason": f"chaos round {rounds}"}).status_code
        )
        time.sleep(0.3)
        oncall_answers.append(oncall.post("/namespaces/chaos/resume", {"reason": "round over"}).status_code)
        faults["epoch fence + resume"] += 1
    for proc in procs:
        proc.wait(max(0, end - time.monotonic()) + 30)

    history = check_invariants(logs, revised=revised)
    assert set(oncall_answers) == {200}, oncall_answers  # never a 503 for an on-call in an incident
    assert pg_deadlocks() == deadlocks_before
    outcomes = defaultdict(int)
    for e in history:
        outcomes[f"{e['op']}:{e['outcome']}"] += 1
    print(
        f"\nCHAOS {len(history)} operations, {rounds} rounds, faults: {dict(faults)}\noutcomes: {dict(outcomes)}"
    )


@pytest.mark.postgres
@pytest.mark.serial
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120 + SECONDS * 4)
def test_nothing_acknowledged_is_lost_when_postgres_restarts_under_load(server, tmp_path):
    if not os.path.isdir("/etc/postgresql") or os.geteuid() != 0:
        pytest.skip("restarting PostgreSQL needs root and a Debian cluster (CI has both)")
    ensure_default_namespace()
    operator = make_actor("chaos-op", "operator")
    operator.post("/namespaces", {"name": "chaos"})
    create_tasks(operator, TASKS)
    workers = [make_actor(f"chaos-w{i}", "worker") for i in range(3)]
    logs = [tmp_path / f"{w.name}.jsonl" for w in workers]
    procs = spawn_workers(server, workers, logs)
    time.sleep(SECONDS * 0.3)
    restart_postgres()
    connection.close()  # this test's own session died with the server; reconnect for the checks
    for proc in procs:
        proc.wait(SECONDS + 30)

    history = check_invariants(logs, min_commits=5)
    failed = [e for e in history if e["outcome"] in ("ERROR", "UNAVAILABLE") or e["status"] >= 500]
    errors = len(failed)
    assert all(e["status"] in (0, 503) for e in failed), [
        e["status"] for e in failed
    ]  # 503 or no answer, never 500
    print(
        f"\nRESTART {len(history)} operations, {errors} failed during the restart, all acknowledged commits kept"
    )


_ACTS_ON_EFFECT = ["prepared", "prepare_seen", "dispatch_recorded", "delivered", "outcome", "reconciled"]


def check_effects(target, *, namespace: str = "chaos") -> dict[str, int]:
    """At most one COMMITTED per effect_id, and no call acted on at the target after it; a COMMITTED effect was
    really called; nothing the target did is recorded FAILED. Returns the figures."""
    figures = defaultdict(int)
    for effect in Effect.objects.filter(namespace__name=namespace):
        figures["effects"] += 1
        figures[f"effects_{effect.state.lower()}"] += 1
        committed = list(EffectEvent.objects.filter(effect=effect, to_state="COMMITTED"))
        assert len(committed) <= 1, (effect.effect_id, committed)
        calls = target.calls.get(effect.effect_id, [])
        figures["target_calls"] += len(calls)
        figures["refused_stale_generation"] += len(target.refused.get(effect.effect_id, []))
        figures["keys_called_more_than_once"] += len(calls) > 1
        if committed:
            at = committed[0].at.timestamp()
            assert calls, f"{effect.effect_id} is COMMITTED but the target never acted"
            assert all(c["at"] < at for c in calls), (
                f"a call at the target after {effect.effect_id} COMMITTED"
            )
        assert effect.state != "FAILED" or not calls, f"{effect.effect_id} acted on but recorded FAILED"
        # No worker's outcome report lands while a dispatch of the effect is in flight (it would move the effect
        # off that delivery, which is then ignored and sent again: a second call, A23), and a report by an
        # attempt other than the one that acted last on the effect is never accepted.
        ledger = list(EffectEvent.objects.filter(effect=effect).order_by("id"))
        intents = list(DispatchIntent.objects.filter(effect=effect))
        for index, entry in enumerate(ledger):
            if entry.kind != "outcome":
                continue
            for intent in intents:
                assert not (
                    intent.created_at <= entry.at
                    and (intent.finished_at is None or entry.at < intent.finished_at)
                ), f"{effect.effect_id}: an outcome report while dispatch {intent.pk} was in flight"
            acts = [e for e in ledger[:index] if e.kind in _ACTS_ON_EFFECT]
            current = (
                Attempt.objects.filter(task_id=effect.task_id, started_at__lte=entry.at)
                .order_by("-claim_generation")
                .values_list("attempt_id", flat=True)
                .first()
            )
            assert entry.attempt_id == current or (acts and acts[-1].attempt_id == entry.attempt_id), (
                f"{effect.effect_id}: a report by {entry.attempt_id} after another attempt acted on the effect"
            )
    reconciled = EffectEvent.objects.filter(effect__namespace__name=namespace, kind="reconciled")
    figures["reconciled_by_workers"] = reconciled.filter(principal__startswith="chaos-w").count()
    figures["reconciled_by_oncall"] = reconciled.exclude(principal__startswith="chaos-w").count()
    return dict(figures)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(120 + SECONDS * 4)
def test_invariants_hold_with_effects_lost_replies_killed_job_workers_a_fence_job_and_a_rollback(
    tmp_path, effect_target, celery_workers
):
    """Scenario 3: a third of the tasks make a direct side effect (the target drops a quarter of its replies after
    acting and fences direct calls on the claim generation), a third dispatch theirs through the gateway (the
    control plane's Celery worker delivers them). Fault rounds, repeated while the run lasts (one at CI size): the
    Celery worker SIGKILLed while it delivers; a chaos worker paused past its lease; an epoch fence made as the
    console makes it, its self-check's job with its Celery worker SIGKILLed inside the check (resend_fences finishes
    it on a fresh worker, once); then a stage move under load — a rollback V1_ONLY → V1_WRITES (fence, drain with on-call
    reconciling UNKNOWN effects by asking the target, stage back, resume), or, the round after, oncall's override
    forward to V1_ONLY again."""
    ensure_default_namespace()
    operator, oncall = make_actor("chaos-op", "operator"), make_actor("chaos-oncall", "oncall")
    operator.post("/namespaces", {"name": "chaos"})
    create_tasks(operator, TASKS * 2, kinds=("plain", "effect", "dispatch"))
    deadlocks_before = pg_deadlocks()
    effect_target.drop_rate, effect_target.delays = 0.25, {"/notify": 0.3}
    effect_target.fence_paths = {"/charge"}
    jobs = JobWorker(celery_workers)
    workers = [make_actor(f"chaos-w{i}", "worker") for i in range(4)]
    logs = [tmp_path / f"{w.name}.jsonl" for w in workers]
    faults: dict[str, int] = defaultdict(int)
    rounds, rng = 0, random.Random(SECONDS)
    with running_server(CELERY_TASK_ALWAYS_EAGER="false") as url:
        # Twice the time of scenario 1: the fences and the rollbacks pause claims for a while.
        end = time.monotonic() + SECONDS * 2
        procs = spawn_workers(url, workers, logs, effect_target.url, seconds=SECONDS * 2)
        while rounds == 0 or time.monotonic() + 12 < end:
            rounds += 1
            # The Celery worker killed while it delivers a dispatch; a fresh one takes over.
            if wait_for(lambda: DispatchIntent.objects.filter(state="SENDING").exists(), seconds=SECONDS):
                jobs.kill_and_restart()
                faults["SIGKILL the Celery worker during deliver_dispatch"] += 1

            paused, killed = rng.sample(range(len(procs)), 2)
            os.kill(procs[paused].pid, signal.SIGSTOP)  # past its 2-second lease
            time.sleep(2.5)
            os.kill(procs[paused].pid, signal.SIGCONT)
            faults["SIGSTOP 2.5 s"] += 1

            # A worker SIGKILLed while its dispatch request is in flight, restarted under the same identity.
            fate = kill_mid(procs[killed], logs[killed], "dispatch")
            faults[f"SIGKILL a worker during a dispatch request ({fate})"] += 1
            log = tmp_path / f"{workers[killed].name}.{rounds}.jsonl"
            logs.append(log)
            procs[killed] = spawn_workers(
                url, [workers[killed]], [log], effect_target.url, seconds=max(1, end - time.monotonic())
            )[0]

            at_kill, runs = fence_through_the_job_killing_its_worker(jobs, oncall, rounds)
            faults[
                f"SIGKILL the Celery worker inside fence_epoch's self-check (request {at_kill}; {runs} runs, one bump)"
            ] += 1
            oncall.post("/namespaces/chaos/resume", {})

            time.sleep(min(1.0, SECONDS * 0.1))
            if stage_of("chaos") == "V1_ONLY":
                outcome = roll_back_under_load(oncall, effect_target)
                faults[f"rollback V1_ONLY → V1_WRITES ({outcome}, finished by the job)"] += 1
            else:
                moved = oncall.post(
                    "/namespaces/chaos/rollout/advance",
                    {"to_stage": "V1_ONLY", "reason": f"chaos round {rounds}", "override": True},
                )
                assert moved.status_code == 200, moved.content
                faults["advance V1_WRITES → V1_ONLY (oncall override)"] += 1
            oncall.post("/namespaces/chaos/resume", {})

        for proc in procs:
            proc.wait(max(0, end - time.monotonic()) + 60)
        # Every dispatch ends delivered or skipped: the dead worker's deliveries are sent again under their key.
        assert wait_for(lambda: redeliver_dispatches.delay() and _deliveries_done(), seconds=40), (
            celery_workers.log()
        )

    history = check_invariants(logs)
    effects = check_effects(effect_target)
    stages = stage_history_replays("chaos")
    assert pg_deadlocks() == deadlocks_before
    assert effects["reconciled_by_workers"] >= 1, effects  # the lost-reply path really ran
    fenced = FenceRequest.objects.filter(namespace="chaos")
    assert all(f.status == "CHECKED" for f in fenced)
    for (
        request
    ) in fenced:  # each fence applied once, whatever its job's deaths (a rollback's fence has its own id)
        assert AuditEntry.objects.filter(action="epoch_fence", target=f"fence:{request.pk}").count() == 1
    outcomes = defaultdict(int)
    for e in history:
        outcomes[f"{e['op']}:{e['outcome']}"] += 1
    deliveries = DispatchIntent.objects.filter(effect__namespace__name="chaos")
    print(
        f"\nCHAOS-FX {len(history)} operations, {rounds} rounds, faults: {dict(faults)}\n"
        f"outcomes: {dict(outcomes)}\neffects: {effects}\nstages: {' → '.join(stages)}\n"
        f"dispatch intents: {deliveries.count()}, delivered more than once: {deliveries.filter(deliveries__gt=1).count()}"
    )


class JobWorker:
    """The control plane's one Celery worker process (Redis, the test database), killed and replaced at will."""

    def __init__(self, workers):
        self.workers = workers
        self.proc = workers.start(**FAST_RESEND_ENV)

    def kill_and_restart(self) -> None:
        self.workers.kill(self.proc)
        self.proc = self.workers.start(**FAST_RESEND_ENV)


def fence_through_the_job_killing_its_worker(jobs: JobWorker, oncall, n: int) -> tuple[str, int]:
    """An epoch fence made as on-call makes it from the console (at once, in the request); its self-check's job
    has its worker SIGKILLed inside the check (the namespace row is held, so the probe commit waits); a fresh worker
    finishes the check through resend_fences. Exactly one epoch bump."""
    epoch_before = Namespace.objects.get(name="chaos").scheduler_epoch
    request = fences.fence(
        principal=Principal.objects.get(name=oncall.name), namespace="chaos", reason=f"chaos round {n}"
    )
    with row_locked("SELECT 1 FROM claims_namespace WHERE name = %s FOR UPDATE", ["chaos"]):
        fence_epoch.delay("chaos", request.reason, oncall.name, str(request.pk))
        assert wait_for(lambda: FenceRequest.objects.get(pk=request.pk).runs >= 1)
        time.sleep(0.2)
        at_kill = FenceRequest.objects.get(pk=request.pk).status
        jobs.kill_and_restart()
    assert wait_for(lambda: resend_fences.delay() and _finished(request.pk), seconds=30), jobs.workers.log()
    fenced = FenceRequest.objects.get(pk=request.pk)
    assert fenced.scheduler_epoch == epoch_before + 1 and fenced.self_check["ok"], fenced.summary()
    assert Namespace.objects.get(name="chaos").scheduler_epoch == epoch_before + 1  # fenced once
    return at_kill, fenced.runs


def roll_back_under_load(oncall, effect_target) -> str:
    """Rollback V1_ONLY → V1_WRITES: fence, drain — on-call reconciles what is UNKNOWN by asking the target, the
    advance_rollback job takes the snapshots — stage back. Returns how the rollback answered at first."""
    started = oncall.post("/namespaces/chaos/rollout/rollback", {"to_stage": "V1_WRITES", "reason": "chaos"})
    assert started.status_code in (200, 202), started.content

    def drained_and_rolled_back() -> bool:
        for effect in Effect.objects.filter(namespace__name="chaos", state="UNKNOWN"):
            occurred = bool(effect_target.calls.get(effect.effect_id))
            oncall.reconcile(
                None,
                effect.effect_id,
                "OCCURRED" if occurred else "NOT_OCCURRED",
                reason="the target says so",
            )
        advance_rollback.delay()
        time.sleep(0.5)
        return not Rollback.objects.filter(namespace="chaos", finished_at__isnull=True).exists()

    assert wait_for(drained_and_rolled_back, seconds=30), list(
        DrainSnapshot.objects.filter(namespace="chaos").order_by("-taken_at").values()[:1]
    )
    assert stage_of("chaos") == "V1_WRITES"
    return started.json()["outcome"]


def _finished(fence_id) -> bool:
    time.sleep(0.5)
    return FenceRequest.objects.get(pk=fence_id).finished_at is not None


def _deliveries_done() -> bool:
    time.sleep(1.0)
    return not DispatchIntent.objects.filter(state__in=["PENDING", "SENDING"]).exists()
