"""Stale authority and rollout state changes under controlled interleavings (acceptance.md A24–A27): who may act
is decided before any store is asked, stage changes are compare-and-set on the stage they start from, fences
and resumes of one namespace never deadlock, and a rollback holds the pause until it ends."""

from __future__ import annotations

import uuid

import pytest
from rest_framework.test import APIClient

from claims.models import Attempt, AuditEntry, Namespace, StagedResult, Task
from rollout.models import ComparedOperation, LegacyClaim, LegacyEvent, Mismatch, Rollback, StageChange
from tests.support.actors import make_actor
from tests.support.races import (
    Pause,
    pg_deadlocks,
    row_locked,
    run_in_thread,
    wait_done_or_waiting,
    wait_for_lock_waiters,
)
from tests.support.rollout import stage_history_replays, stage_of

pytestmark = pytest.mark.django_db(transaction=True)


def _ns(operator, name: str, stage: str) -> str:
    assert operator.post("/namespaces", {"name": name, "stage": stage}).status_code == 201
    return name


def _legacy(actor, task_id, op, **body):
    return actor.client.post(
        f"/api/legacy/tasks/{task_id}/{op}", {"owner_id": actor.name, **body}, format="json"
    )


# --- A24: in SHADOW and V1_READS, who may act is decided before any store is asked ---------------------------


@pytest.mark.parametrize("stage", ["SHADOW", "V1_READS"])
def test_a24_a_worker_cannot_commit_another_workers_attempt_in_any_stage(operator, stage):
    worker_a, worker_b = make_actor("owner-a", "worker"), make_actor("intruder-b", "worker")
    namespace = _ns(operator, stage.lower().replace("_", "-"), stage)
    task_id = operator.create(namespace=namespace).json()["task_id"]
    claim = worker_a.claim(task_id).json()
    assert claim["attempt_id"], claim
    worker_a.stage(claim, {"by": "a"})
    compared_before = ComparedOperation.objects.count()

    foreign = worker_b.commit(claim, {"by": "a"})
    invented = worker_b.commit({**claim, "attempt_id": str(uuid.uuid4())}, {"by": "a"})
    unstaged = worker_a.commit(claim, {"never": "staged"})

    assert foreign.status_code == 403, foreign.json()
    assert invented.status_code == 409 and invented.json()["outcome"] == "FENCED", invented.json()
    assert unstaged.status_code == 409 and unstaged.json()["outcome"] == "NOT_STAGED", unstaged.json()
    legacy_row = LegacyClaim.objects.get(pk=task_id)
    assert (legacy_row.owner_id, legacy_row.result, legacy_row.completed_by) == ("owner-a", None, "")
    task = Task.objects.get(pk=task_id)
    assert (task.state, task.result) == ("CLAIMED", None)
    assert not StagedResult.objects.filter(canonical=True).exists()
    assert ComparedOperation.objects.count() == compared_before  # nothing reached the comparison either


# --- A25: an advance and a rollback of one namespace at once -----------------------------------------------


@pytest.mark.postgres
def test_a25_an_advance_racing_a_rollback_never_undoes_the_rollback(operator, settings):
    oncall = make_actor("oncall-rb", "oncall")
    settings.ROLLOUT_MIN_COVERAGE_SAMPLES = 0
    namespace = _ns(operator, "racing", "V1_READS")
    for point in ("claim", "renew", "release", "effect", "commit"):
        operator.post(f"/namespaces/{namespace}/coverage/waive", {"point": point, "reason": "no traffic"})
    pause = Pause("rollout_advance.gated")

    advancing, advance_box = run_in_thread(
        lambda: operator.post(
            f"/namespaces/{namespace}/rollout/advance", {"to_stage": "V1_WRITES", "reason": "gate holds"}
        )
    )
    pause.wait_reached()  # the advance has read the stage and judged the gate
    rolling, rollback_box = run_in_thread(
        lambda: oncall.post(
            f"/namespaces/{namespace}/rollout/rollback", {"to_stage": "SHADOW", "reason": "incident"}
        )
    )
    wait_done_or_waiting(rollback_box, 1)
    pause.resume()
    advancing.join(30)
    rolling.join(30)

    rolled = rollback_box["value"]
    assert rolled.status_code == 200 and rolled.json()["outcome"] == "ROLLED_BACK", rolled.json()
    assert stage_of(namespace) == "SHADOW"
    assert stage_history_replays(namespace)[-1] == "SHADOW"
    advanced = advance_box["value"]
    if advanced.status_code != 200:
        assert advanced.status_code == 409 and advanced.json()["outcome"] in (
            "INVALID_TRANSITION",
            "ROLLBACK_IN_PROGRESS",
        ), advanced.json()


def _open_rollback(operator, oncall, namespace: str) -> dict:
    """A rollback that waits on its drain: a legacy-API lease is still live."""
    old = make_actor("legacy-holder", "worker", "legacy")
    held = operator.create(namespace=namespace, node_id="long").json()["task_id"]
    assert _legacy(old, held, "claim", ttl_seconds=300).status_code == 200
    started = oncall.post(
        f"/namespaces/{namespace}/rollout/rollback", {"to_stage": "SHADOW", "reason": "drill"}
    )
    assert started.status_code == 202 and started.json()["outcome"] == "ROLLBACK_STARTED", started.json()
    return {"worker": old, "task_id": held}


def test_an_advance_while_a_rollback_is_open_is_refused_with_its_own_word(operator):
    oncall = make_actor("oncall-rb", "oncall")
    namespace = _ns(operator, "draining", "V1_READS")
    _open_rollback(operator, oncall, namespace)

    advanced = operator.post(
        f"/namespaces/{namespace}/rollout/advance", {"to_stage": "V1_WRITES", "reason": "now"}
    )
    overridden = oncall.post(
        f"/namespaces/{namespace}/rollout/advance",
        {"to_stage": "V1_WRITES", "reason": "override", "override": True},
    )

    for response in (advanced, overridden):
        assert response.status_code == 409 and response.json()["outcome"] == "ROLLBACK_IN_PROGRESS"
    assert stage_of(namespace) == "V1_READS"
    assert not StageChange.objects.filter(namespace=namespace).exists()


@pytest.mark.postgres
def test_two_rollbacks_asked_at_once_start_one_and_the_other_says_so(operator):
    """Issue 24: two on-call engineers roll back at once while the namespace row is held. The second decides under
    the lock the first took (the open Rollback row, FOR UPDATE): one rollback, one fence, and the other answered
    409 ROLLBACK_IN_PROGRESS — before, it answered 202 "started" and changed nothing."""
    oncall = make_actor("oncall-rb", "oncall")
    namespace = _ns(operator, "twice-at-once", "V1_READS")
    old = make_actor("legacy-holder", "worker", "legacy")
    held = operator.create(namespace=namespace, node_id="long").json()["task_id"]
    assert _legacy(old, held, "claim", ttl_seconds=300).status_code == 200  # the drain waits on it
    epoch = Namespace.objects.get(name=namespace).scheduler_epoch

    def roll_back():
        return oncall.post(
            f"/namespaces/{namespace}/rollout/rollback", {"to_stage": "SHADOW", "reason": "incident"}
        )

    with row_locked("SELECT 1 FROM claims_namespace WHERE name = %s FOR UPDATE", [namespace]):
        first, one = run_in_thread(roll_back)
        second, two = run_in_thread(roll_back)
        wait_for_lock_waiters(2)
    first.join(30), second.join(30)

    answers = sorted((box["value"].status_code, box["value"].json()["outcome"]) for box in (one, two))
    assert answers == [(202, "ROLLBACK_STARTED"), (409, "ROLLBACK_IN_PROGRESS")]
    assert Rollback.objects.filter(namespace=namespace).count() == 1
    assert Namespace.objects.get(name=namespace).scheduler_epoch == epoch + 1  # one fence
    assert stage_of(namespace) == "V1_READS"


# --- A27: resume while a rollback is open -------------------------------------------------------------------


def test_a27_resume_while_a_rollback_is_open_is_refused_whoever_asks_until_it_ends(operator):
    from oncall.services import fence_now

    oncall = make_actor("oncall-rb", "oncall")
    namespace = _ns(operator, "holding", "V1_READS")
    left = _open_rollback(operator, oncall, namespace)

    by_api = oncall.post(f"/namespaces/{namespace}/resume", {"reason": "customers waiting"})
    assert by_api.status_code == 409 and by_api.json()["outcome"] == "PAUSE_HELD", by_api.json()
    from claims import services
    from claims.errors import Conflict
    from claims.models import Principal

    with pytest.raises(Conflict) as refused:
        services.namespace_resume(
            principal=Principal.objects.get(name="oncall-rb"), namespace=namespace, reason="by the service"
        )
    assert refused.value.outcome == "PAUSE_HELD"
    # Another fence during the rollback keeps the hold.
    fence_now(principal=Principal.objects.get(name="oncall-rb"), namespace=namespace, reason="second fence")
    assert Namespace.objects.get(name=namespace).claims_paused

    done = left["worker"]
    _legacy(done, left["task_id"], "release")
    finished = oncall.post(
        f"/namespaces/{namespace}/rollout/rollback", {"to_stage": "SHADOW", "reason": "drill"}
    )
    assert finished.status_code == 200 and finished.json()["outcome"] == "ROLLED_BACK", finished.json()
    ns = Namespace.objects.get(name=namespace)
    assert (stage_of(ns.name), ns.claims_paused) == (
        "SHADOW",
        True,
    )  # claims stay paused until someone resumes
    resumed = oncall.post(f"/namespaces/{namespace}/resume", {"reason": "rollback done"})
    assert resumed.status_code == 200 and not Namespace.objects.get(name=namespace).claims_paused
    entry = AuditEntry.objects.filter(action="namespace_resume", namespace=namespace).get()
    assert (entry.principal, entry.reason) == ("oncall-rb", "rollback done")


# --- A26: 20 concurrent fences and resumes of one namespace ---------------------------------------------------


@pytest.mark.postgres
def test_a26_concurrent_fences_and_resumes_finish_without_deadlock_each_fence_applied_once(operator):
    from claims.models import Principal
    from oncall.services import fence_now

    oncall = make_actor("oncall-many", "oncall")
    _ns(operator, "incident", "V1_ONLY")
    worker = make_actor("busy", "worker")
    for _ in range(3):
        task_id = operator.create(namespace="incident").json()["task_id"]
        worker.claim(task_id)
    principal = Principal.objects.get(name="oncall-many")
    deadlocks_before = pg_deadlocks()

    def call(index: int):
        if index % 5 == 4:  # the fence_epoch job's service, as two jobs at once would run it
            return fence_now(principal=principal, namespace="incident", reason=f"job {index}")
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {oncall.token}")
        path = "fence" if index % 2 == 0 else "resume"
        return client.post(f"/api/v1/namespaces/incident/{path}", {"reason": f"call {index}"}, format="json")

    threads = [run_in_thread(lambda i=i: call(i)) for i in range(20)]
    for thread, _ in threads:
        thread.join(60)

    boxes = [box for _, box in threads]
    assert all("error" not in box for box in boxes), [box.get("error") for box in boxes]
    answers = [box["value"] for box in boxes if hasattr(box["value"], "status_code")]
    assert [r.status_code for r in answers] == [200] * len(answers), [r.content for r in answers]
    fences = [i for i in range(20) if i % 2 == 0 or i % 5 == 4]
    ns = Namespace.objects.get(name="incident")
    assert ns.scheduler_epoch == 1 + len(fences)
    assert AuditEntry.objects.filter(action="epoch_fence", namespace="incident").count() == len(fences)
    assert pg_deadlocks() == deadlocks_before


# --- entering SHADOW while claims are paused ----------------------------------------------------------------


def test_entering_shadow_while_claims_are_paused_is_refused_and_says_why(operator):
    oncall = make_actor("oncall-sh", "oncall")
    namespace = _ns(operator, "importing", "LEGACY")
    old = make_actor("legacy-old", "worker", "legacy")
    new = make_actor("v1-new", "worker", "v1")
    held = operator.create(namespace=namespace).json()["task_id"]
    assert _legacy(old, held, "claim", ttl_seconds=300).status_code == 200
    new.post("/workers/register", {"protocol": "claim.v1", "binary_version": "1", "namespace": namespace})
    oncall.post(f"/namespaces/{namespace}/fence", {"reason": "pause first"})

    refused = operator.post(
        f"/namespaces/{namespace}/rollout/advance", {"to_stage": "SHADOW", "reason": "go"}
    )
    assert refused.status_code == 409 and refused.json()["outcome"] == "CLAIMS_PAUSED", refused.json()
    assert stage_of(namespace) == "LEGACY"
    assert Task.objects.get(pk=held).claim_generation == 0

    oncall.post(f"/namespaces/{namespace}/resume", {"reason": "ready to import"})
    opened = operator.post(f"/namespaces/{namespace}/rollout/advance", {"to_stage": "SHADOW", "reason": "go"})
    assert opened.status_code == 200, opened.json()
    task = Task.objects.get(pk=held)
    assert (task.state, task.owner_id, task.claim_generation) == ("CLAIMED", "legacy-old", 1)
    assert StageChange.objects.get(namespace=namespace).to_stage == "SHADOW"
    entry = AuditEntry.objects.get(action="legacy_import", namespace=namespace)
    assert entry.detail == {"imported": 1, "skipped": {}}


def test_the_fence_self_check_is_never_counted_as_traffic(operator):
    from claims.models import Principal, TaskEvent
    from oncall.services import fence_now
    from rollout import selectors

    make_actor("oncall-probe", "oncall")
    namespace = _ns(operator, "probed", "V1_ONLY")
    worker = make_actor("probe-worker", "worker")
    task_id = operator.create(namespace=namespace).json()["task_id"]
    worker.finish(worker.claim(task_id).json(), {"ok": 1})
    ns = Namespace.objects.get(name=namespace)
    before = selectors.coverage(ns)["points"]["commit"]

    request = fence_now(principal=Principal.objects.get(name="oncall-probe"), namespace=namespace, reason="t")

    assert request.self_check["ok"] is True
    after = selectors.coverage(Namespace.objects.get(name=namespace))["points"]["commit"]
    assert (after["validated"], after["total"]) == (before["validated"], before["total"]) == (1, 1)
    assert not TaskEvent.objects.filter(task_id=task_id, kind="fenced").exists()


# --- routing decides on the stage and epoch it holds ---------------------------------------------------------
# The routing reads the stage (and the epoch, and whether claims are paused) to choose who decides. Where legacy
# decides, that choice is made again under the namespace row's FOR SHARE lock, in legacy's own transaction: an
# advance, a rollback or a fence (each takes the row FOR NO KEY UPDATE) that landed between the first read and the
# decision sends the request back through the routing.


def _overtaken(point: str, request, interloper):
    """Run ``request`` on its own connection until it reaches ``point``, let ``interloper`` run to completion
    there, then let the request finish. Returns both answers."""
    pause = Pause(point)
    thread, box = run_in_thread(request)
    pause.wait_reached()
    interloped = interloper()
    pause.resume()
    thread.join(30)
    assert "error" not in box, box
    return box["value"], interloped


def _routed_setup(operator, name: str, stage: str, worker: str) -> tuple:
    oncall = make_actor(f"oncall-{name}", "oncall")
    namespace = _ns(operator, name, stage)
    task_id = operator.create(namespace=namespace).json()["task_id"]
    return oncall, make_actor(worker, "worker"), namespace, task_id


def _advance_to_v1_writes(oncall, namespace):
    return lambda: oncall.post(
        f"/namespaces/{namespace}/rollout/advance",
        {"to_stage": "V1_WRITES", "reason": "go", "override": True},
    )


def _fence(oncall, namespace):
    return lambda: oncall.post(f"/namespaces/{namespace}/fence", {"reason": "incident"})


@pytest.mark.postgres
def test_an_advance_to_v1_writes_between_the_routing_read_and_legacys_decision_reroutes_to_claim_v1(operator):
    oncall, worker, namespace, task_id = _routed_setup(operator, "routing-advance", "V1_READS", "router-a")

    # routed to legacy on V1_READS, legacy not yet asked, when the advance lands
    claimed, advanced = _overtaken(
        "routing.routed", lambda: worker.claim(task_id), _advance_to_v1_writes(oncall, namespace)
    )

    assert advanced.status_code == 200, advanced.json()
    answer = claimed.json()
    assert claimed.status_code == 200, answer
    assert "decided_by" not in answer  # claim.v1 decided: V1_WRITES, not legacy
    assert Task.objects.get(pk=task_id).owner_id == "router-a"
    legacy_row = LegacyClaim.objects.get(pk=task_id)
    assert legacy_row.via == "claim.v1"  # written through from claim.v1's grant, not granted by legacy
    assert not ComparedOperation.objects.filter(namespace=namespace).exists()


@pytest.mark.postgres
def test_a_fence_between_the_routing_read_and_legacys_decision_grants_no_claim(operator):
    oncall, worker, namespace, task_id = _routed_setup(operator, "routing-fence", "SHADOW", "router-b")

    # routed to legacy on epoch 1 with claims not paused, when the fence lands
    claimed, fenced = _overtaken("routing.routed", lambda: worker.claim(task_id), _fence(oncall, namespace))

    assert fenced.status_code == 200, fenced.json()
    answer = claimed.json()
    assert claimed.status_code == 409 and answer["outcome"] == "FENCED", answer  # the carried epoch is old
    assert not LegacyClaim.objects.filter(pk=task_id).exclude(owner_id="").exists()
    assert Task.objects.get(pk=task_id).state == "READY"


@pytest.mark.postgres
def test_an_advance_closing_the_legacy_protocol_before_legacys_decision_refuses_the_legacy_claim(operator):
    oncall, worker, namespace, task_id = _routed_setup(operator, "legacy-closing", "V1_READS", "router-c")

    claimed, advanced = _overtaken(
        "legacy_operation.routed",
        lambda: _legacy(worker, task_id, "claim", ttl_seconds=30),
        _advance_to_v1_writes(oncall, namespace),
    )

    assert advanced.status_code == 200, advanced.json()
    answer = claimed.json()
    assert claimed.status_code == 409 and answer["outcome"] == "PROTOCOL_TOO_OLD", answer
    assert not LegacyClaim.objects.filter(pk=task_id).exclude(owner_id="").exists()
    assert Task.objects.get(pk=task_id).state == "READY"


def _settling_while(request, interloper):
    """Run ``request`` until its decision is written and not yet settled (``routing.settling``: inside the core's
    transaction, the namespace held FOR SHARE); start ``interloper``, see it wait for that lock, then let the
    request commit. Returns both answers."""
    pause = Pause("routing.settling")
    thread, box = run_in_thread(request)
    pause.wait_reached()
    other, other_box = run_in_thread(interloper)
    wait_for_lock_waiters(1)  # the fence waits for the decision in flight
    assert "value" not in other_box
    pause.resume()
    thread.join(30)
    other.join(30)
    assert "error" not in box and "error" not in other_box, (box, other_box)
    return box["value"], other_box["value"]


@pytest.mark.postgres
def test_a_fence_arriving_while_a_v1_writes_grant_is_written_through_waits_for_both(operator):
    """Issue 22: the grant and its write-through are one transaction. A fence that arrives in between waits for
    it, so the legacy store and claim.v1 never disagree on who was granted before the fence. (Before, they were two
    transactions and the fence could land between them; the write-through then re-checked the epoch.)"""
    oncall, worker, namespace, task_id = _routed_setup(operator, "writing-through", "V1_WRITES", "router-d")

    claimed, fenced = _settling_while(lambda: worker.claim(task_id), _fence(oncall, namespace))

    assert claimed.status_code == 200 and fenced.status_code == 200, (claimed.json(), fenced.json())
    granted = claimed.json()
    assert granted["scheduler_epoch"] == 1 and Namespace.objects.get(name=namespace).scheduler_epoch == 2
    row = LegacyClaim.objects.get(pk=task_id)
    assert (row.owner_id, row.via) == (
        "router-d",
        "claim.v1",
    )  # written through with the grant, before the fence
    attempt = Attempt.objects.get(pk=granted["attempt_id"])
    assert attempt.ended_at is not None  # and the fence, after both, ended it


@pytest.mark.postgres
def test_in_shadow_legacys_decision_and_claim_v1s_judgement_commit_together_before_a_fence(operator):
    """Issue 22: where legacy decides, its decision, its history, claim.v1's judgement and the comparison are one
    transaction; a fence that arrives in between waits for all of them."""
    oncall, worker, namespace, task_id = _routed_setup(operator, "settling-shadow", "SHADOW", "router-g")

    claimed, fenced = _settling_while(lambda: worker.claim(task_id), _fence(oncall, namespace))

    assert claimed.status_code == 200 and fenced.status_code == 200, (claimed.json(), fenced.json())
    assert claimed.json()["decided_by"] == "legacy"
    assert LegacyClaim.objects.get(pk=task_id).owner_id == "router-g"
    assert LegacyEvent.objects.filter(task_id=task_id, verdict="GRANTED").count() == 1
    assert ComparedOperation.objects.filter(namespace=namespace, agreed=True).count() == 1
    assert Attempt.objects.get(pk=claimed.json()["attempt_id"]).ended_at is not None


@pytest.mark.postgres
def test_a_fence_between_claim_v1s_refusal_and_legacys_own_decision_sends_the_request_through_again(operator):
    """claim.v1 refused where legacy decides (another owner's live claim): legacy decides in a transaction of its
    own, on the epoch it reads under the namespace's lock. A fence that lands in between sends the request through
    the routing again, where the old carried epoch is claim.v1's alone to refuse — legacy never grants it."""
    oncall, worker, namespace, task_id = _routed_setup(operator, "refused-then-fenced", "SHADOW", "router-h")
    make_actor("router-i", "worker").claim(task_id)  # claim.v1 and legacy: router-i holds it
    LegacyClaim.objects.filter(pk=task_id).update(owner_id="", expires_at=None)  # legacy's table lost it

    claimed, fenced = _overtaken("routing.refused", lambda: worker.claim(task_id), _fence(oncall, namespace))

    assert fenced.status_code == 200, fenced.json()
    assert claimed.status_code == 409 and claimed.json()["outcome"] == "FENCED", claimed.json()
    assert LegacyClaim.objects.get(pk=task_id).owner_id == ""  # legacy was never asked


@pytest.mark.postgres
def test_a_gate_evaluation_is_recorded_for_the_stage_it_was_evaluated_in(operator):
    """The gate-check job reads the stage under the namespace's lock: an advance that lands while it evaluates
    waits for the evaluation to be recorded, so no evaluation is filed under a stage that had already ended."""
    from rollout.models import GateEvaluation
    from rollout.tasks import gate_check

    oncall = make_actor("oncall-gate", "oncall")
    namespace = _ns(operator, "gate-racing", "LEGACY")
    pause = Pause("evaluate_gate.held")

    checker, checked = run_in_thread(lambda: gate_check(namespace))
    pause.wait_reached()  # the job has read the stage (LEGACY) and not yet recorded its evaluation
    advancer, advanced = run_in_thread(
        lambda: oncall.post(
            f"/namespaces/{namespace}/rollout/advance",
            {"to_stage": "SHADOW", "reason": "go", "override": True},
        )
    )
    wait_done_or_waiting(advanced, 1)
    pause.resume()
    checker.join(30)
    advancer.join(30)

    assert "error" not in checked and advanced["value"].status_code == 200, (checked, advanced)
    changes = list(StageChange.objects.filter(namespace=namespace).order_by("at"))
    for evaluation in GateEvaluation.objects.filter(namespace=namespace):
        earlier = [c for c in changes if c.at < evaluation.at]
        in_force = earlier[-1].to_stage if earlier else "LEGACY"
        assert evaluation.move.startswith(f"{in_force} "), (evaluation.move, evaluation.at, changes)


# A stage change that commits while a routed decision waits for the namespace lock must be seen by that decision.
# PostgreSQL re-reads only the locked row after such a wait, so the stage (another table) is read in a statement
# of its own once the lock is held. The stage writer here is a lock held by the test: the namespace row FOR NO KEY
# UPDATE with the stage changed in the same transaction, as an advance or a rollback changes it.

_STAGE_WRITER = (
    "WITH held AS (SELECT id FROM claims_namespace WHERE name = %s FOR NO KEY UPDATE) "
    "UPDATE rollout_rolloutstate SET stage = %s WHERE namespace_id IN (SELECT id FROM held)"
)


def _decided_while_the_stage_changes(request, namespace: str, to_stage: str, *, paused_at: str | None = None):
    """Run ``request``; while it waits on the namespace lock (after ``paused_at``, if given), a stage change to
    ``to_stage`` commits. Returns the answer."""
    pause = Pause(paused_at) if paused_at else None
    if pause:
        thread, box = run_in_thread(request)
        pause.wait_reached()
    with row_locked(_STAGE_WRITER, [namespace, to_stage]):
        if pause:
            pause.resume()
        else:  # started under the held lock: it cannot pass the lock before the stage writer holds it (CI saw that)
            thread, box = run_in_thread(request)
        wait_for_lock_waiters(1)
    thread.join(30)
    assert "error" not in box, box
    return box["value"]


@pytest.mark.postgres
def test_a_rollback_committed_while_the_fast_path_waits_for_the_lock_is_written_through(operator):
    _, worker, namespace, task_id = _routed_setup(operator, "fast-rolled-back", "V1_ONLY", "router-e")

    # the stage hook reads the stage under the lock: V1_WRITES, so claim.v1's grant goes to legacy too
    claimed = _decided_while_the_stage_changes(lambda: worker.claim(task_id), namespace, "V1_WRITES")

    assert claimed.status_code == 200, claimed.json()
    assert Task.objects.get(pk=task_id).owner_id == "router-e"
    assert LegacyClaim.objects.get(pk=task_id).owner_id == "router-e"  # a rollback will find it there


@pytest.mark.postgres
def test_an_advance_committed_while_legacys_decision_waits_for_the_lock_reroutes_to_claim_v1(operator):
    _, worker, namespace, task_id = _routed_setup(operator, "legacy-advanced", "SHADOW", "router-f")

    claimed = _decided_while_the_stage_changes(
        lambda: worker.claim(task_id), namespace, "V1_WRITES", paused_at="routing.routed"
    )

    answer = claimed.json()
    assert claimed.status_code == 200, answer
    assert "decided_by" not in answer  # claim.v1 decided: the stage is V1_WRITES
    assert not ComparedOperation.objects.filter(namespace=namespace).exists()
    assert LegacyClaim.objects.get(pk=task_id).owner_id == "router-f"


# --- the legacy store: a row absent when locked, inserted by another transaction before the write ---------------


@pytest.mark.postgres
def test_a_legacy_claim_whose_row_another_claim_inserted_meanwhile_is_decided_again_and_refused(operator):
    """Issue 22: the store decides on the rows it locked; a task with no row yet has nothing to lock, so a second
    claim can insert the row between this one's read and its write. The INSERT skips a row that exists and the
    skipped task is decided again on the row it can now lock — HELD — instead of a second grant (or a 500)."""
    namespace = _ns(operator, "legacy-insert-race", "LEGACY")
    task_id = operator.create(namespace=namespace).json()["task_id"]
    first, second = make_actor("legacy-first", "worker"), make_actor("legacy-second", "worker")

    claimed, interloped = _overtaken(
        "legacy_store.decided",
        lambda: _legacy(first, task_id, "claim", ttl_seconds=60),
        lambda: _legacy(second, task_id, "claim", ttl_seconds=60),
    )

    assert interloped.status_code == 200, interloped.json()
    assert claimed.status_code == 409 and claimed.json()["outcome"] == "HELD", claimed.json()
    assert LegacyClaim.objects.get(pk=task_id).owner_id == "legacy-second"
    verdicts = list(
        LegacyEvent.objects.filter(task_id=task_id).order_by("id").values_list("owner_id", "verdict")
    )
    assert verdicts == [("legacy-second", "GRANTED"), ("legacy-first", "HELD")]


@pytest.mark.postgres
def test_the_legacy_store_decides_on_the_clock_read_after_its_row_lock():
    """A legacy worker's transaction holds a task's row while the store is asked to claim the task for another
    owner. Once the store waits for the row, that transaction sets the row's expiry to its own clock and commits:
    an instant after the store began, before it holds the row. With the clock read after the lock, the expiry has
    passed — takeover, GRANTED. With the clock read before the lock (seen failing so), it lies ahead — HELD."""
    from django.db import DEFAULT_DB_ALIAS, connections, transaction
    from django.utils import timezone

    from rollout.legacy import DjangoLegacyStore

    LegacyClaim.objects.create(
        task_id="clock-after-lock", namespace="legacy-clock", owner_id="w1", updated_at=timezone.now()
    )
    holder = connections.create_connection(DEFAULT_DB_ALIAS)
    try:
        holder.set_autocommit(False)
        with holder.cursor() as cursor:
            cursor.execute("SELECT 1 FROM rollout_legacyclaim WHERE task_id = 'clock-after-lock' FOR UPDATE")

        def claim():
            with transaction.atomic():
                return DjangoLegacyStore().claim(
                    task_id="clock-after-lock", namespace="legacy-clock", owner_id="w2", ttl_seconds=30
                )

        thread, box = run_in_thread(claim)
        wait_for_lock_waiters(1)
        with holder.cursor() as cursor:
            cursor.execute(
                "UPDATE rollout_legacyclaim SET expires_at = clock_timestamp() WHERE task_id = 'clock-after-lock'"
            )
        holder.commit()
        thread.join(20)
    finally:
        holder.close()

    assert box["value"].word == "GRANTED", box
    assert LegacyClaim.objects.get(pk="clock-after-lock").owner_id == "w2"


@pytest.mark.postgres
def test_a_registration_decides_on_the_stage_under_the_namespace_lock(operator):
    """A legacy-protocol worker registers while an advance to V1_WRITES runs. The registration's decision (is the
    protocol too old for the stage?) is made on the stage read under the namespace row's lock, which every stage
    change takes first: paused after deciding, it holds the advance back, so its record (refused or not, and when)
    belongs to the stage it read. Decided outside the lock (seen failing so), the advance commits meanwhile and the
    registration lands after it, judged on the stage before."""
    from rollout.models import WorkerRegistration

    namespace = _ns(operator, "register-race", "V1_READS")
    oncall = make_actor("oncall-register", "oncall")
    old = make_actor("old-worker", "worker")
    pause = Pause("worker_register.decided")
    thread, box = run_in_thread(
        lambda: old.client.post(
            "/api/v1/workers/register",
            {"protocol": "legacy", "binary_version": "1.0", "namespace": namespace},
            format="json",
        )
    )
    pause.wait_reached()
    advancing, advanced = run_in_thread(
        lambda: oncall.post(
            f"/namespaces/{namespace}/rollout/advance",
            {"to_stage": "V1_WRITES", "reason": "race", "override": True},
        )
    )
    wait_done_or_waiting(advanced, 1)
    held_back = "value" not in advanced  # the advance waits for the registration's lock
    pause.resume()
    thread.join(20)
    advancing.join(20)

    assert held_back, advanced
    assert box["value"].status_code == 201, box["value"].json()
    assert advanced["value"].status_code == 200, advanced["value"].json()
    registration = WorkerRegistration.objects.get(principal="old-worker", namespace=namespace)
    change = StageChange.objects.filter(namespace=namespace, to_stage="V1_WRITES").get()
    assert registration.registered_at <= change.at


@pytest.mark.postgres
def test_two_legacy_claims_of_one_task_are_judged_by_claim_v1_in_the_order_legacy_decided_them(operator):
    """SHADOW, the legacy API: legacy grants A's claim, then answers B's HELD. claim.v1 must judge them in that
    order. Paused after legacy decided A and before claim.v1 judged it, B used to overtake (found by the drill):
    claim.v1 granted B, whom legacy had told HELD, then refused A — two DOUBLE_GRANT mismatches where the stores
    agree. Decided in claim.v1's transaction, under the task's lock, B waits for A."""
    namespace = _ns(operator, "legacy-order", "SHADOW")
    task_id = operator.create(namespace=namespace).json()["task_id"]
    a, b = make_actor("legacy-a", "worker"), make_actor("legacy-b", "worker")
    pause = Pause("legacy_operation.decided")
    first, first_box = run_in_thread(lambda: _legacy(a, task_id, "claim", ttl_seconds=60))
    pause.wait_reached()
    second, second_box = run_in_thread(lambda: _legacy(b, task_id, "claim", ttl_seconds=60))
    wait_done_or_waiting(second_box, 1)
    pause.resume()
    first.join(30)
    second.join(30)

    assert first_box["value"].status_code == 200, first_box["value"].json()
    assert second_box["value"].status_code == 409, second_box["value"].json()
    assert second_box["value"].json()["outcome"] == "HELD"
    assert list(Mismatch.objects.filter(task_id=task_id).values_list("reason", flat=True)) == []
    assert Task.objects.get(pk=task_id).owner_id == "legacy-a"
    assert LegacyClaim.objects.get(pk=task_id).owner_id == "legacy-a"
