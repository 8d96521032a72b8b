"""The effect ledger (claim-v1.md §6): one record per slot, a bound payload, UNKNOWN never FAILED, and recovery
that reconciles instead of calling again (A8, A9, A19). Call counts are taken at a real HTTP target."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from claims.digest import canonical_json, digest
from claims.models import AuditEntry, Effect, EffectEvent, TaskEvent


@pytest.fixture
def claim_a(worker_a, ready_task):
    return worker_a.claim(ready_task, ttl=5).json()


def _call_target(target, key: str, payload, generation: int):
    """What a worker does between prepare and outcome: the external call, with the effect's key."""
    return httpx.post(
        target.url + "/act",
        content=canonical_json(payload),
        headers={
            "Idempotency-Key": key,
            "X-Claim-Generation": str(generation),
            "Content-Type": "application/json",
        },
        timeout=1,
    )


def test_prepare_creates_the_slot_bound_to_its_payload(worker_a, claim_a, ready_task):
    response = worker_a.prepare(claim_a, "notify", {"to": "ops"})

    assert response.status_code == 201
    body = response.json()
    expected = hashlib.sha256(f"{ready_task}\nbuild-parser\nnotify".encode()).hexdigest()
    assert body == {
        "outcome": "PREPARED",
        "effect_id": expected,
        "state": "PREPARED",
        "payload_digest": digest({"to": "ops"}),
        "idempotency_key": expected,
    }
    effect = Effect.objects.get(pk=expected)
    assert (effect.state, effect.payload_digest) == ("PREPARED", digest({"to": "ops"}))
    assert TaskEvent.objects.filter(kind="effect_prepared", point="effect", via="").count() == 1


def test_the_same_payload_again_is_prepared_and_another_is_a_payload_conflict(worker_a, claim_a):
    first = worker_a.prepare(claim_a, "notify", {"to": "ops"})
    again = worker_a.prepare(claim_a, "notify", {"to": "ops"})
    other = worker_a.prepare(claim_a, "notify", {"to": "everyone"})

    assert (first.status_code, again.status_code) == (201, 200) and again.json()["outcome"] == "PREPARED"
    assert other.status_code == 409 and other.json()["outcome"] == "PAYLOAD_CONFLICT"
    assert other.json()["current"] == {
        "effect_id": first.json()["effect_id"],
        "state": "PREPARED",
        "bound_payload_digest": digest({"to": "ops"}),
    }
    assert Effect.objects.get().payload_digest == digest({"to": "ops"})


def test_outcomes_decide_what_the_next_prepare_says(worker_a, claim_a):
    key = worker_a.prepare(claim_a, "a", 1).json()["effect_id"]
    worker_a.outcome(claim_a, key, "UNKNOWN")
    assert worker_a.prepare(claim_a, "a", 1).json()["outcome"] == "RECONCILE_REQUIRED"

    key_b = worker_a.prepare(claim_a, "b", 2).json()["effect_id"]
    worker_a.outcome(claim_a, key_b, "COMMITTED", external_ref="msg-17")
    assert worker_a.prepare(claim_a, "b", 2).json()["outcome"] == "ALREADY_COMMITTED"

    key_c = worker_a.prepare(claim_a, "c", 3).json()["effect_id"]
    worker_a.outcome(claim_a, key_c, "FAILED")
    retried = worker_a.prepare(claim_a, "c", 3)
    assert (retried.json()["outcome"], retried.json()["state"]) == ("PREPARED", "PREPARED")

    assert worker_a.outcome(claim_a, key_b, "FAILED").json()["outcome"] == "INVALID_TRANSITION"
    assert Effect.objects.get(pk=key_b).external_ref == "msg-17"
    assert list(EffectEvent.objects.filter(effect_id=key_c).values_list("kind", "to_state")) == [
        ("prepared", "PREPARED"),
        ("outcome", "FAILED"),
        ("prepared", "PREPARED"),
    ]


def test_reconcile_only_from_unknown_and_by_the_current_attempt_or_an_operator(worker_a, claim_a, operator):
    key = worker_a.prepare(claim_a, "a", 1).json()["effect_id"]

    early = worker_a.reconcile(claim_a, key, "OCCURRED")
    worker_a.outcome(claim_a, key, "UNKNOWN")
    no_reason = [operator.reconcile(None, key, "NOT_OCCURRED", reason=r) for r in ("", "   ")]
    by_operator = operator.reconcile(None, key, "NOT_OCCURRED", reason="the mail log has no such message")

    assert early.status_code == 409 and early.json()["outcome"] == "NOT_UNKNOWN"
    # It sends the effect again: an operator says why, at the API as in the console (issue 35).
    assert [r.status_code for r in no_reason] == [400, 400] and "reason" in no_reason[0].json()["errors"]
    assert by_operator.json() == {"outcome": "RECONCILED", "state": "PREPARED"}
    (entry,) = AuditEntry.objects.filter(action="effect_reconcile", principal="olivia-operator")
    assert entry.reason == "the mail log has no such message"


def test_a_worker_must_name_its_attempt_to_reconcile(worker_a, claim_a):
    key = worker_a.prepare(claim_a, "a", 1).json()["effect_id"]
    worker_a.outcome(claim_a, key, "UNKNOWN")

    response = worker_a.post(f"/effects/{key}/reconcile", {"observed": "OCCURRED"})

    assert response.status_code == 400 and "attempt_id" in response.json()["errors"]
    assert Effect.objects.get(pk=key).state == "UNKNOWN"


def test_every_effect_call_checks_epoch_generation_attempt_owner_and_cancel(
    worker_a, worker_b, claim_a, ready_task, operator, oncall, db_clock
):
    key = worker_a.prepare(claim_a, "a", 1).json()["effect_id"]
    as_b = worker_b.prepare(claim_a, "a", 1)  # owner_id worker-b, attempt of worker-a
    stale_generation = worker_a.prepare(claim_a, "a", 1, claim_generation=7)
    db_clock.travel(6)
    expired = worker_a.prepare(claim_a, "a", 1)

    assert as_b.status_code == 403
    assert stale_generation.json()["reason"] == "GENERATION"
    assert (expired.json()["outcome"], expired.json()["reason"]) == ("FENCED", "LEASE_EXPIRED")
    claim_b = worker_b.claim(ready_task, ttl=30).json()
    operator.post(f"/tasks/{ready_task}/cancel", {"reason": "stop"})
    assert worker_b.prepare(claim_b, "a", 1).json()["outcome"] == "CANCELLED"
    assert Effect.objects.get(pk=key).state == "PREPARED"
    fenced = TaskEvent.objects.filter(kind="fenced", point="effect")
    assert fenced.count() == 3 and set(fenced.values_list("via", flat=True)) == {""}


def test_a3_after_an_epoch_fence_preparing_an_effect_is_fenced_by_epoch(worker_a, claim_a, oncall):
    oncall.post("/namespaces/default/fence", {"reason": "rollback"})

    old = worker_a.prepare(claim_a, "a", 1)
    resent = worker_a.prepare(claim_a, "a", 1, scheduler_epoch=2)

    for response in (old, resent):
        assert (response.json()["outcome"], response.json()["reason"]) == ("FENCED", "EPOCH")
    assert not Effect.objects.exists()
    assert TaskEvent.objects.filter(kind="fenced", point="effect").count() == 2


def test_a8_a_takeover_with_another_payload_gets_payload_conflict_and_reconciles_the_first(
    worker_a, worker_b, claim_a, ready_task, effect_target, db_clock
):
    prepared = worker_a.prepare(claim_a, "charge", {"amount": 10}).json()
    key = prepared["idempotency_key"]
    effect_target.mode = "drop_reply"
    with pytest.raises(httpx.HTTPError):
        _call_target(effect_target, key, {"amount": 10}, claim_a["claim_generation"])
    assert worker_a.outcome(claim_a, key, "UNKNOWN").json()["state"] == "UNKNOWN"  # a timeout, never FAILED
    db_clock.travel(6)  # A is gone; B takes over and computes a different payload for the same slot
    claim_b = worker_b.claim(ready_task).json()

    conflict = worker_b.prepare(claim_b, "charge", {"amount": 12})
    original = worker_b.prepare(claim_b, "charge", {"amount": 10})
    occurred = httpx.get(f"{effect_target.url}/calls/{key}").json()["occurred"]
    reconciled = worker_b.reconcile(claim_b, key, "OCCURRED" if occurred else "NOT_OCCURRED")
    after = worker_b.prepare(claim_b, "charge", {"amount": 10})

    assert conflict.status_code == 409 and conflict.json()["outcome"] == "PAYLOAD_CONFLICT"
    assert original.json()["outcome"] == "RECONCILE_REQUIRED"
    assert reconciled.json() == {"outcome": "RECONCILED", "state": "COMMITTED"}
    assert after.json()["outcome"] == "ALREADY_COMMITTED"
    assert effect_target.count(key) == 1 and effect_target.count() == 1  # zero second external calls


def test_a8_outcome_reports_are_accepted_from_the_preparing_attempt_even_after_it_was_fenced(
    worker_a, worker_b, claim_a, ready_task, db_clock
):
    key = worker_a.prepare(claim_a, "charge", 1).json()["effect_id"]
    db_clock.travel(6)
    worker_b.claim(ready_task)

    late_report = worker_a.outcome(claim_a, key, "UNKNOWN")
    stranger = worker_b.outcome(claim_a, key, "COMMITTED", owner_id="worker-b")

    assert late_report.json() == {"outcome": "RECORDED", "state": "UNKNOWN"}
    assert stranger.status_code == 403
