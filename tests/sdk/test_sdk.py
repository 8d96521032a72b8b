"""The SDK as its own distribution (clients/python, claim-client): outcome words generated from the server's own
errors, batches, inline commit, waiting, the retry policy, and an install without the server."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import claim_client as sdk
import httpx
import pytest

from claims.models import StagedResult, Task
from tests.support.actors import ensure_default_namespace, make_actor

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import gen_sdk_outcomes  # noqa: E402


def test_the_sdk_knows_every_outcome_word_the_server_answers_with():
    generated = gen_sdk_outcomes.render(gen_sdk_outcomes.conflict_words())

    assert (ROOT / "clients/python/claim_client/outcomes.py").read_text() == generated  # run the generator
    for word in (
        "STAGE_NOT_OPEN",
        "PROTOCOL_TOO_OLD",
        "GATE_NOT_MET",
        "HELD",
        "NOT_OWNER",
        "PAUSE_HELD",
        "FENCED",
    ):
        assert sdk.BY_OUTCOME[word].outcome == word
    assert sdk.error_of(429, {"outcome": "THROTTLED"}).__class__ is sdk.Throttled
    assert sdk.error_of(503, {"outcome": "UNAVAILABLE"}).__class__ is sdk.Unavailable
    assert sdk.digest({"b": [1, "é"], "a": None}) == __import__("claims.digest").digest.digest(
        {"a": None, "b": [1, "é"]}
    )


# --- the retry policy (an HTTP transport that answers as told; the server's database is not involved) ---------


def _scripted(answers: list, keys: list | None = None):
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if keys is not None:
            keys.append(request.headers.get("Idempotency-Key"))
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    return sdk.ControlPlane("http://cp", "t", owner_id="w", transport=httpx.MockTransport(handler)), calls


def _claim(**extra):
    return sdk.Claim("t1", "a1", 1, 1, 0, "2026-01-01T00:00:00Z", "sha256:" + "0" * 64, 1, {}, {}, **extra)


COMMITTED = {"outcome": "COMMITTED", "result_commit_id": "c1", "unblocked": []}


def test_429_and_503_are_sent_again_after_retry_after(monkeypatch):
    monkeypatch.setattr(time, "sleep", lambda s: None)
    cp, calls = _scripted(
        [
            httpx.Response(429, json={"outcome": "THROTTLED"}, headers={"Retry-After": "0"}),
            httpx.Response(503, json={"outcome": "UNAVAILABLE"}),
            httpx.Response(204),
        ]
    )

    assert cp.claim_next(scheduler_epoch=1, ttl_seconds=30) is None
    assert len(calls) == 3


def test_a_lost_reply_is_retried_for_a_commit_and_for_a_claim_with_its_key_and_never_for_a_release(
    monkeypatch,
):
    monkeypatch.setattr(time, "sleep", lambda s: None)
    cp, calls = _scripted([httpx.ReadTimeout("lost"), httpx.Response(200, json=COMMITTED)])
    assert cp.commit(_claim(), {"r": 1}).result_commit_id == "c1"  # a repeat returns the stored answer
    assert len(calls) == 2

    keys: list[str | None] = []
    cp, calls = _scripted([httpx.ReadTimeout("lost"), httpx.Response(204), httpx.Response(204)], keys=keys)
    assert (
        cp.claim_next(scheduler_epoch=1, ttl_seconds=30) is None
    )  # the repeat answers what the first granted
    assert cp.claim_next(scheduler_epoch=1, ttl_seconds=30) is None
    assert len(calls) == 3 and keys[0] == keys[1] != keys[2] and keys[0] and keys[2]  # a key per claim

    cp, calls = _scripted([httpx.ReadTimeout("lost")])
    with pytest.raises(httpx.ReadTimeout):
        cp.release(_claim())
    assert len(calls) == 1


# --- against a live server ---------------------------------------------------------------------------------


@pytest.fixture
def server(live_server):
    ensure_default_namespace()
    return live_server.url


def _cp(server, actor, **kw) -> sdk.ControlPlane:
    return sdk.ControlPlane(server, actor.token, owner_id=actor.name, timeout=5, **kw)


@pytest.mark.django_db(transaction=True)
def test_batches_inline_commit_and_a_refused_item_among_good_ones(server):
    op = make_actor("olivia-operator", "operator")
    ids = [op.create(node_id=f"n{i}").json()["task_id"] for i in range(4)]
    a, b = (_cp(server, make_actor(name, "worker")) for name in ("worker-a", "worker-b"))

    claims = a.claim_batch(max_tasks=10, scheduler_epoch=1, ttl_seconds=30)
    assert sorted(c.task_id for c in claims) == sorted(ids)
    a.release(claims[0])
    taken = b.claim(claims[0].task_id, scheduler_epoch=1, ttl_seconds=30)  # A's first claim is over
    answers = a.commit_many([(c, {"n": c.task_id}) for c in claims])

    assert isinstance(answers[0], sdk.Fenced) and answers[0].reason == "GENERATION"
    assert all(isinstance(x, sdk.Committed) and x.staged_result_id for x in answers[1:])
    assert Task.objects.get(pk=taken.task_id).state == "CLAIMED"
    assert StagedResult.objects.filter(canonical=True).count() == 3
    assert b.commit(taken, {"n": "b"}).staged_result_id  # inline: one request
    assert a.claim_batch(max_tasks=10, scheduler_epoch=1, ttl_seconds=5) == []


class _LosesTheFirstClaimAnswer(httpx.HTTPTransport):
    """The server answers the first claim; the connection drops before the worker reads it (as when the app
    server or the database's leader dies right after the commit)."""

    def __init__(self) -> None:
        super().__init__()
        self.lost = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if request.url.path.endswith("/claims") and not self.lost:
            response.read()
            self.lost += 1
            raise httpx.ReadError("the connection dropped before the answer was read")
        return response


@pytest.mark.django_db(transaction=True)
def test_a_claim_whose_answer_was_lost_is_sent_again_and_leaves_one_live_attempt(server, monkeypatch):
    """Issue 39, point 4: the SDK sends the claim again with its key; the server answers the grant it made —
    the worker holds the one task it was told of, and the other is still there for others."""
    from claims.models import Attempt

    monkeypatch.setattr(time, "sleep", lambda s: None)
    op = make_actor("olivia-operator", "operator")
    ids = {op.create(node_id=f"n{i}").json()["task_id"] for i in range(2)}
    transport = _LosesTheFirstClaimAnswer()
    worker = _cp(server, make_actor("worker-a", "worker"), transport=transport)

    claim = worker.claim_next(scheduler_epoch=1, ttl_seconds=30)

    assert transport.lost == 1 and claim is not None
    live = list(
        Attempt.objects.filter(owner_id="worker-a", ended_at=None).values_list("attempt_id", flat=True)
    )
    assert [str(a) for a in live] == [claim.attempt_id]
    assert Task.objects.get(pk=(ids - {claim.task_id}).pop()).state == "READY"
    assert worker.commit(claim, {"ok": True}).staged_result_id


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_sdk_rides_through_a_failover(server):
    """The database fails over under the worker: its claim meets a history the control plane has not recorded and
    is answered 503 with Retry-After (tests/claims/test_failover.py); the SDK waits and sends it again — the worker
    sees one claim, then commits."""
    from django.db import connection

    from claims.models import ServedHistory
    from claims.services.serving import serving_live

    if connection.vendor != "postgresql":
        pytest.skip("failover is PostgreSQL's")
    task_id = make_actor("olivia-operator", "operator").create(node_id="n").json()["task_id"]
    worker = _cp(server, make_actor("worker-a", "worker"))
    live = serving_live()
    before = ServedHistory.objects.create(
        system_identifier=live.system_identifier,
        timeline=live.timeline + 1,
        synchronous=True,
        seen_at="2026-01-01T00:00:00Z",
        cause="test: the history before the switch",
    )

    claim = worker.claim_next(scheduler_epoch=1, ttl_seconds=30)

    assert claim is not None and claim.task_id == task_id
    assert worker.commit(claim, {"ok": True}).staged_result_id
    assert ServedHistory.objects.filter(pk__gt=before.pk).get().timeline == live.timeline


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_waiting_claim_next_returns_the_task_created_meanwhile(server):
    op = make_actor("olivia-operator", "operator")
    a = _cp(server, make_actor("worker-a", "worker"))
    later = threading.Timer(0.5, lambda: op.create(node_id="later"))
    later.start()

    claim = a.claim_next(scheduler_epoch=1, ttl_seconds=30, wait_seconds=10)

    later.join()
    assert claim is not None and Task.objects.get(pk=claim.task_id).node_id == "later"


@pytest.mark.django_db(transaction=True)
def test_a_namespace_at_legacy_raises_stage_not_open(server):
    op = make_actor("olivia-operator", "operator")
    assert op.post("/namespaces", {"name": "old", "stage": "LEGACY"}).status_code == 201
    task_id = op.create(namespace="old").json()["task_id"]
    a = _cp(server, make_actor("worker-a", "worker"))

    with pytest.raises(sdk.StageNotOpen):
        a.claim(task_id, scheduler_epoch=1, ttl_seconds=5)
    assert Task.objects.get(pk=task_id).claim_generation == 0


@pytest.mark.django_db(transaction=True)
def test_priority_and_fair_share_through_the_sdk(server):
    """claim-v1.md §10 from the SDK: tasks created with a priority and a key, the urgent one claimed first, an
    operator's priority change audited; a create sent again after a lost reply is one task."""
    op = _cp(server, make_actor("olivia-operator", "operator"))
    worker = _cp(server, make_actor("worker-a", "worker"))
    routine = op.create_task("n", {"n": 1}, fairness_key="tenant-a", fairness_weight=2)
    urgent = op.create_task("n", {"n": 2}, priority=1, fairness_key="tenant-b")
    again = op.create_task("n", {"n": 2}, task_id=urgent["task_id"], priority=1, fairness_key="tenant-b")

    assert (routine["priority"], routine["fairness_key"], routine["fairness_weight"]) == (3, "tenant-a", 2.0)
    assert again["task_id"] == urgent["task_id"] and Task.objects.count() == 2
    first = worker.claim_next(scheduler_epoch=1, ttl_seconds=30)
    assert first is not None and first.task_id == urgent["task_id"]
    moved = op.set_priority(routine["task_id"], 2, reason="customer escalation")
    assert moved["priority"] == 2
    with pytest.raises(sdk.Forbidden):
        worker.set_priority(routine["task_id"], 1, reason="me first")
    assert Task.objects.get(pk=routine["task_id"]).priority == 2
    plain = op.create_task(
        "n", {"n": 3}, namespace=None, priority=None, fairness_key=None
    )  # None: the default
    assert (Task.objects.get(pk=plain["task_id"]).priority, plain["fairness_key"]) == (3, "")


RELEASED_1_9 = "f4f85ac"  # the last commit whose SDK was 1.9.0 (claim.v1 with §9, before §10)


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(600)
def test_the_released_1_9_sdk_is_unaffected(server, tmp_path):
    """An older client sends none of §10: it claims oldest first, exactly as before, and commits."""
    import shutil
    import tarfile

    archive = tmp_path / "sdk.tar"
    done = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "-o", str(archive), RELEASED_1_9, "clients/python"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"the 1.9 SDK's commit is part of this repository's history: {done.stderr}"
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path, filter="data")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin/python"), "-m", "pip", "install", "--quiet", str(tmp_path / "clients/python")],
        check=True,
        timeout=300,
    )
    op, worker = make_actor("olivia-operator", "operator"), make_actor("old-worker", "worker")
    ids = [op.create(node_id="n", task_id=f"t-{n}").json()["task_id"] for n in (2, 0, 1)]
    flow = (
        "import json, sys, claim_client as c\n"
        "cp = c.ControlPlane(sys.argv[1], sys.argv[2], owner_id=sys.argv[3])\n"
        "order = []\n"
        "while (claim := cp.claim_next(scheduler_epoch=1, ttl_seconds=30)) is not None:\n"
        "    order.append(claim.task_id)\n"
        "    cp.commit(claim, {'by': 'old'})\n"
        "print(json.dumps({'version': c.__version__, 'order': order}))\n"
    )
    out = subprocess.run(
        [str(venv / "bin/python"), "-c", flow, server, worker.token, worker.name],
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(out.stdout) == {"version": "1.9.0", "order": ids}
    assert {t.state for t in Task.objects.all()} == {"COMMITTED"}
    shutil.rmtree(tmp_path / "clients")


def test_the_sdk_installs_and_imports_without_the_server(tmp_path):
    import shutil

    source = tmp_path / "claim-client"  # a copy: building in place would leave build/ in the checkout
    shutil.copytree(ROOT / "clients" / "python", source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet"]
    subprocess.run([*pip, str(source)], check=True, timeout=300)
    probe = (
        "import sys, claim_client as c; "
        "assert 'django' not in sys.modules and 'claims' not in sys.modules, sorted(sys.modules); "
        "print(c.__version__, len(c.BY_OUTCOME))"
    )
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", probe], check=True, capture_output=True, text=True
    )
    assert out.stdout.split() == [sdk.__version__, str(len(sdk.BY_OUTCOME))]


def test_every_reason_the_code_gives_is_in_the_schema_enum():
    import re

    from claims import errors

    literals = set()
    for package in ("claims", "rollout"):
        for path in (ROOT / package).rglob("*.py"):
            literals |= set(re.findall(r'reason="([A-Z_]+)"', path.read_text()))

    assert literals and literals <= set(errors.conflict_reasons())
