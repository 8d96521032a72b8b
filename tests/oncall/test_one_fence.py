"""One fence, acting at once (issue 24): the API, the console and the CLI fence through ``oncall.services.fence`` —
in the request's own transaction the namespace is paused and the epoch bumped and the durable request recorded,
so the next claim is refused whether or not any job ever runs; the job only checks. A fence's figures count only
the attempts that were live when it was made, and the pages say what it has refused since."""

from __future__ import annotations

import pytest
from django.core.management import call_command

from claims.models import Attempt, AuditEntry, Namespace, TaskEvent
from oncall import tasks as oncall_jobs
from oncall.models import FenceRequest
from tests.support.console import login


def _fence_via(door: str, oncall) -> None:
    if door == "api":
        assert oncall.post("/namespaces/default/fence", {"reason": f"via {door}"}).status_code == 200
    elif door == "cli":
        call_command("fence", "default", reason=f"via {door}", principal=oncall.name)
    else:
        page = login("oncall").post("/ns/default/fence", {"reason": f"via {door}", "confirm": "default"})
        assert page.status_code == 302


@pytest.mark.parametrize("door", ["api", "console", "cli"])
def test_every_door_fences_in_its_own_request_and_the_next_claim_is_refused(
    door, oncall, operator, worker_a, default_namespace, monkeypatch
):
    monkeypatch.setattr(oncall_jobs.fence_epoch, "delay", lambda *a, **k: None)  # no job runs at all
    task_id = operator.create().json()["task_id"]

    _fence_via(door, oncall)

    namespace = Namespace.objects.get(name="default")
    assert (namespace.scheduler_epoch, namespace.claims_paused) == (2, True)
    request = FenceRequest.objects.get()
    assert (request.scheduler_epoch, request.reason) == (2, f"via {door}")
    fenced = AuditEntry.objects.get(action="epoch_fence")
    assert fenced.target == f"fence:{request.fence_id}" and fenced.at == request.requested_at
    refused = worker_a.claim(task_id, epoch=2)
    assert refused.status_code == 409 and refused.json()["outcome"] == "CLAIMS_PAUSED"
    # The API and the CLI check at once; the console leaves the check to its job (which did not run here).
    assert request.status == ("FENCED" if door == "console" else "CHECKED")


def test_a_fence_counts_only_the_attempts_that_were_live(oncall, operator, worker_a, worker_b, db_clock):
    """Two fences on one namespace: the first ends the three live claims, the second ends none — it does not end
    them again, nor count a lease that had already run out."""
    live = [operator.create().json()["task_id"] for _ in range(3)]
    lapsed = operator.create().json()["task_id"]
    worker_b.claim(lapsed, ttl=1)
    db_clock.travel(2)
    for task_id in live:
        worker_a.claim(task_id, ttl=60)

    assert oncall.post("/namespaces/default/fence", {"reason": "first"}).status_code == 200
    assert oncall.post("/namespaces/default/fence", {"reason": "second"}).status_code == 200

    figures = list(
        AuditEntry.objects.filter(action="epoch_fence").order_by("id").values_list("detail__fenced_attempts")
    )
    assert figures == [(3,), (0,)]
    marked = TaskEvent.objects.filter(kind="epoch_fenced").values_list("task_id", flat=True)
    assert sorted(marked) == sorted(live)  # one mark per live attempt, none for the lapsed lease
    assert Attempt.objects.filter(ended_at__isnull=True).count() == 0  # every earlier attempt ended
    fences = login("viewer").get("/ns/default/incident").context["fences"]
    assert [(f["reason"], f["fenced_attempts"]) for f in fences] == [("second", 0), ("first", 3)]


def test_the_pages_say_what_the_fence_has_refused_since(oncall, operator, worker_a, default_namespace):
    task_id = operator.create().json()["task_id"]
    late = worker_a.claim(task_id).json()
    assert oncall.post("/namespaces/default/fence", {"reason": "stale writers"}).status_code == 200

    worker_a.commit_inline(late, "too late")  # refused FENCED (EPOCH)
    worker_a.renew(late)  # refused FENCED
    other = operator.create().json()["task_id"]
    worker_a.claim(other, epoch=2)  # refused: claims are paused

    page = login("oncall").get("/ns/default/incident")

    refused = page.context["incident"]["refused_since_fence"]
    recorded = TaskEvent.objects.filter(kind="fenced", at__gte=page.context["incident"]["paused_by"].at)
    assert refused["total"] == recorded.count() == 3
    assert (refused["commit"], refused["renew"], refused["claim"]) == (1, 1, 1)
    # Issue 36: counted by the contract's outcome word — the paused claim is not a FENCED refusal.
    assert refused["fenced"] == 2 and refused["by_word"] == {"FENCED (EPOCH)": 2, "CLAIMS_PAUSED": 1}
    assert b"<strong>2</strong> requests refused FENCED, 3 refused in all" in page.content
    assert b'id="refused-since"' in page.content and b'id="resume-form"' in page.content


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_one_form_submitted_twice_at_once_fences_once():
    """Two submits of one fence form (its id) reach the service together while the namespace row is held: the
    second decides, under the lock the first took, that the fence is made — one epoch bump, one request."""
    import uuid

    from claims.models import Principal
    from oncall import services
    from tests.support.actors import ensure_default_namespace, make_actor
    from tests.support.races import row_locked, run_in_thread, wait_for_lock_waiters

    ensure_default_namespace()
    oncall = Principal.objects.get(name=make_actor("ona-race", "oncall").name)
    fence_id = uuid.uuid4()

    def submit():
        return services.fence(principal=oncall, namespace="default", reason="double", fence_id=fence_id)

    with row_locked("SELECT 1 FROM claims_namespace WHERE name = %s FOR UPDATE", ["default"]):
        first, one = run_in_thread(submit)
        second, two = run_in_thread(submit)
        wait_for_lock_waiters(2)
    first.join(30), second.join(30)

    assert one["value"].pk == two["value"].pk == fence_id
    assert Namespace.objects.get(name="default").scheduler_epoch == 2
    assert FenceRequest.objects.count() == 1
    assert AuditEntry.objects.filter(action="epoch_fence").count() == 1


def test_a_fence_form_of_another_namespace_fences_nothing_and_says_so(oncall, operator, default_namespace):
    """The form's id is the fence's: posted to another namespace it must not pass for that namespace's fence."""
    assert operator.post("/namespaces", {"name": "other", "stage": "V1_ONLY"}).status_code == 201
    form = {
        "reason": "stale writers",
        "confirm": "default",
        "fence_id": "0b7a4a52-8f1e-4d36-9d59-2f1f3a0c9e11",
    }
    ui = login("oncall")
    ui.post("/ns/default/fence", form)

    page = ui.post("/ns/other/fence", {**form, "confirm": "other"}, follow=True)

    assert b"belongs to namespace default" in page.content
    assert Namespace.objects.get(name="other").scheduler_epoch == 1  # not fenced, and not said to be
    assert list(FenceRequest.objects.values_list("namespace", flat=True)) == ["default"]
