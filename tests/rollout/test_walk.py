"""One namespace walked LEGACY → SHADOW → V1_READS → V1_WRITES → V1_ONLY with simulated legacy and claim.v1
workers — each gate refusing first and opening only when its figures hold — then a rollback with a fence.
Covers A15–A18 along the way. The gates' recorded figures are printed (run with -s) for the release notes."""

from __future__ import annotations

import json

import pytest

from claims.digest import digest
from claims.models import Effect, Namespace, Task
from rollout.models import GateEvaluation, LegacyClaim, Mismatch, StageChange
from tests.support.actors import make_actor
from tests.support.rollout import stage_of

NS = "payments"


def legacy(actor, task_id, op, **body):
    return actor.client.post(
        f"/api/legacy/tasks/{task_id}/{op}", {"owner_id": actor.name, **body}, format="json"
    )


def advance(actor, to_stage, **extra):
    return actor.post(f"/namespaces/{NS}/rollout/advance", {"to_stage": to_stage, "reason": "walk", **extra})


def v1_cycle(worker, operator, *, effect=False):
    """A claim.v1 worker's full cycle: claim, renew, (effect), stage, commit — every acceptance point."""
    task_id = operator.create(namespace=NS, node_id="v1-work").json()["task_id"]
    claim = worker.claim(task_id, ttl=30).json()
    worker.renew(claim)
    if effect:
        key = worker.prepare(claim, "notify", {"n": task_id}).json()["effect_id"]
        worker.outcome(claim, key, "COMMITTED")
    worker.stage(claim, {"done": task_id})
    assert worker.commit(claim, {"done": task_id}).status_code == 200
    return task_id


def legacy_cycle(worker, operator):
    task_id = operator.create(namespace=NS, node_id="legacy-work").json()["task_id"]
    assert legacy(worker, task_id, "claim", ttl_seconds=30).status_code == 200
    legacy(worker, task_id, "heartbeat", ttl_seconds=30)
    legacy(worker, task_id, "complete", result={"ok": 1}, result_digest=digest({"ok": 1}))
    return task_id


@pytest.fixture
def small_gates(settings):
    settings.ROLLOUT_MIN_SAMPLES = 20
    settings.ROLLOUT_MIN_COVERAGE_SAMPLES = 20
    settings.ROLLOUT_WINDOW_SECONDS = 60
    settings.DRAIN_INTERVAL_SECONDS = 15


def test_a_namespace_walks_every_gate_then_rolls_back_with_a_fence(operator, oncall, small_gates, db_clock):
    assert operator.post("/namespaces", {"name": NS, "stage": "LEGACY"}).status_code == 201
    old = make_actor("legacy-1", "worker", "legacy")
    old_2 = make_actor("legacy-2", "worker", "legacy")
    new = make_actor("v1-1", "worker", "v1")
    held = operator.create(namespace=NS, node_id="long-running").json()["task_id"]
    assert legacy(old, held, "claim", ttl_seconds=300).status_code == 200

    # LEGACY → SHADOW: needs a registered claim.v1 worker with a fresh heartbeat.
    refused = advance(operator, "SHADOW")
    assert refused.status_code == 409 and refused.json()["outcome"] == "GATE_NOT_MET"
    assert refused.json()["current"]["figures"] == {"v1_workers": 0}
    assert (
        new.post(
            "/workers/register", {"protocol": "claim.v1", "binary_version": "2.4.0", "namespace": NS}
        ).status_code
        == 201
    )
    opened = advance(operator, "SHADOW")
    assert opened.status_code == 200 and opened.json()["gate"]["figures"] == {"v1_workers": 1}
    # The live legacy claim was imported as a claim.v1 attempt: both stores start equal.
    imported = Task.objects.get(pk=held)
    assert (imported.state, imported.owner_id, imported.claim_generation) == ("CLAIMED", "legacy-1", 1)

    # SHADOW: mixed traffic; a paused legacy worker overwrites after a takeover (A16).
    late = operator.create(namespace=NS, node_id="settle").json()["task_id"]
    assert legacy(old_2, late, "claim", ttl_seconds=5).status_code == 200
    db_clock.travel(6)
    takeover = new.claim(late, ttl=30).json()
    new.stage(takeover, {"by": "v1"})
    new.commit(takeover, {"by": "v1"})
    legacy(old_2, late, "complete", result={"by": "legacy-2"}, result_digest=digest({"by": "legacy-2"}))
    stale = Mismatch.objects.get(reason="STALE_COMMIT_ACCEPTED")
    too_few = advance(operator, "V1_READS")
    assert too_few.json()["outcome"] == "GATE_NOT_MET"
    for _ in range(3):
        legacy_cycle(old, operator)
        v1_cycle(new, operator)
    blocked = advance(operator, "V1_READS")
    figures = blocked.json()["current"]["figures"]
    assert blocked.status_code == 409 and figures["compared"] >= 20 and figures["open_mismatches"] == 1
    operator.post(
        f"/mismatches/{stale.pk}/review",
        {"status": "EXPLAINED", "note": "legacy last-write-wins; claim.v1 kept the v1 winner as designed"},
    )
    assert advance(operator, "V1_READS").status_code == 200

    # V1_READS → V1_WRITES: coverage 100% at every point, enough requests. Legacy traffic is never validated.
    legacy_cycle(old, operator)
    v1_cycle(new, operator, effect=True)
    mixed = advance(operator, "V1_WRITES")
    assert mixed.status_code == 409 and 0 < mixed.json()["current"]["figures"]["points"]["claim"] < 1
    # The old pool leaves something behind for the drain gate (A17): a lease, an UNKNOWN effect, a staged result.
    leftover = operator.create(namespace=NS, node_id="leftover").json()["task_id"]
    left_claim = old.claim(leftover, ttl=300).json()
    assert left_claim["decided_by"] == "legacy" and left_claim["attempt_id"]
    left_effect = old.prepare(left_claim, "email", {"to": "x"}).json()["effect_id"]
    old.outcome(left_claim, left_effect, "UNKNOWN")
    old.stage(left_claim, {"partial": True})
    db_clock.travel(61)  # the mixed traffic leaves the window
    quiet = advance(operator, "V1_WRITES")
    quiet_figures = quiet.json()["current"]["figures"]
    assert (
        quiet.status_code == 409 and quiet_figures["requests"] < 20
    )  # no traffic: a zero fenced count never passes
    for index in range(6):
        v1_cycle(new, operator, effect=index == 0)
    assert new.release(new.claim(operator.create(namespace=NS).json()["task_id"]).json()).status_code == 200
    covered = advance(operator, "V1_WRITES")
    assert covered.status_code == 200, covered.json()
    assert set(covered.json()["gate"]["figures"]["points"].values()) == {1.0}

    # V1_WRITES: old binaries may not return (A15).
    assert legacy(old, leftover, "heartbeat", ttl_seconds=30).json()["outcome"] == "PROTOCOL_TOO_OLD"
    too_old = old.post("/workers/register", {"protocol": "legacy", "binary_version": "1.9", "namespace": NS})
    assert too_old.status_code == 409 and too_old.json()["outcome"] == "PROTOCOL_TOO_OLD"
    assert old.claim(operator.create(namespace=NS).json()["task_id"]).json()["outcome"] == "PROTOCOL_TOO_OLD"

    # V1_WRITES → V1_ONLY: the legacy pool must drain, two clean snapshots DRAIN_INTERVAL apart (A17).
    dirty = advance(operator, "V1_ONLY")
    dirty_figures = dirty.json()["current"]["figures"]
    assert dirty.status_code == 409
    assert dirty_figures["active_leases"] >= 1 and dirty_figures["unknown_effects"] == 1
    assert dirty_figures["awaiting_commit"] == 1
    operator.reconcile(None, left_effect, "OCCURRED")
    db_clock.travel(301)  # the old pool's leases run out
    first_clean = advance(operator, "V1_ONLY")
    assert first_clean.status_code == 409 and first_clean.json()["current"]["figures"]["clean_streak"] == 1
    db_clock.travel(15)
    drained = advance(operator, "V1_ONLY")
    assert drained.status_code == 200 and drained.json()["gate"]["figures"]["clean_streak"] == 2
    assert stage_of(NS) == "V1_ONLY"

    # Rollback: fence → drain → stage back → claims stay paused.
    epoch_before = Namespace.objects.get(name=NS).scheduler_epoch
    pending = operator.create(namespace=NS, node_id="after").json()["task_id"]
    after_claim = new.claim(pending, epoch=epoch_before).json()
    key = new.prepare(after_claim, "notify", {"x": 1}).json()["effect_id"]
    new.outcome(after_claim, key, "UNKNOWN")
    assert (
        operator.post(
            f"/namespaces/{NS}/rollout/rollback", {"to_stage": "V1_WRITES", "reason": "x"}
        ).status_code
        == 403
    )
    started = oncall.post(
        f"/namespaces/{NS}/rollout/rollback", {"to_stage": "V1_WRITES", "reason": "incident 7"}
    )
    assert started.status_code == 202 and started.json()["outcome"] == "ROLLBACK_STARTED"
    assert started.json()["scheduler_epoch"] == epoch_before + 1
    assert started.json()["drain"]["unknown_effects"] == 1  # the progress it shows
    # The fence ended the pre-fence attempt everywhere, even with the new epoch re-sent.
    assert new.renew(after_claim, scheduler_epoch=epoch_before + 1).json()["reason"] == "EPOCH"
    oncall.reconcile(None, key, "NOT_OCCURRED", reason="checked the target: nothing there")
    done = oncall.post(
        f"/namespaces/{NS}/rollout/rollback", {"to_stage": "V1_WRITES", "reason": "incident 7"}
    )
    assert done.status_code == 200 and done.json()["outcome"] == "ROLLED_BACK"
    namespace = Namespace.objects.get(name=NS)
    assert (stage_of(namespace.name), namespace.claims_paused) == ("V1_WRITES", True)
    assert Effect.objects.get(pk=key).state == "PREPARED"
    assert LegacyClaim.objects.filter(pk=late).exists()
    assert [c.to_stage for c in StageChange.objects.filter(namespace=NS).order_by("at", "id")] == [
        "SHADOW",
        "V1_READS",
        "V1_WRITES",
        "V1_ONLY",
        "V1_WRITES",
    ]

    evaluations = [
        {"move": g.move, "holds": g.holds, "figures": g.figures}
        for g in GateEvaluation.objects.filter(namespace=NS).order_by("at", "id")
    ]
    print("\nGATE EVALUATIONS\n" + json.dumps(evaluations, indent=1, default=str))
