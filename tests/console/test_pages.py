"""The operator console through Django's test client: every page renders for its roles, actions check the role,
go through services, and are audited with the principal. (tests/e2e drives the same pages in Chromium.)"""

from __future__ import annotations

import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client

from claims.models import AuditEntry, Effect, Namespace
from tests.support.actors import make_actor
from tests.support.console import login
from tests.support.rollout import stage_of


@pytest.fixture
def viewer(db):
    return login("viewer")


@pytest.fixture
def ui_operator(db):
    return login("operator")


@pytest.fixture
def ui_oncall(db):
    return login("oncall")


@pytest.mark.parametrize(
    "path", ["/", "/ns/default/", "/ns/default/mismatches", "/tasks/", "/effects/", "/pools/", "/glance/"]
)
def test_every_page_renders_for_a_viewer(viewer, ready_task, path):
    response = viewer.get(path)

    assert response.status_code == 200 and b"claim control plane" in response.content


def test_a_viewer_cannot_act(viewer, default_namespace):
    response = viewer.post("/ns/default/fence", {"reason": "x", "confirm": "default"})

    assert response.status_code == 403
    assert Namespace.objects.get(name="default").scheduler_epoch == 1


def test_the_fence_needs_a_reason_and_the_typed_name_and_is_audited(ui_oncall, ui_operator, ready_task):
    assert ui_operator.post("/ns/default/fence", {"reason": "x", "confirm": "default"}).status_code == 403
    ui_oncall.post("/ns/default/fence", {"reason": "incident", "confirm": "wrong"})
    assert Namespace.objects.get(name="default").scheduler_epoch == 1

    page = ui_oncall.post("/ns/default/fence", {"reason": "incident", "confirm": "default"}, follow=True)

    assert Namespace.objects.get(name="default").scheduler_epoch == 2
    assert AuditEntry.objects.filter(action="epoch_fence", principal="ui:oncall-user").exists()
    assert b"old-epoch commit refused: FENCED (EPOCH)" in page.content


def test_advance_shows_the_gate_before_confirming(ui_operator, operator):
    from rollout.models import GateEvaluation
    from rollout.tasks import gate_check

    operator.post("/namespaces", {"name": "pay", "stage": "LEGACY"})
    unrecorded = ui_operator.get("/ns/pay/advance?to=SHADOW")
    assert (
        b"not evaluated yet" in unrecorded.content and not GateEvaluation.objects.exists()
    )  # a read records nothing
    gate_check()  # the beat job records the gate

    confirm = ui_operator.get("/ns/pay/advance?to=SHADOW")
    refused = ui_operator.post("/ns/pay/advance", {"to_stage": "SHADOW", "reason": "go"}, follow=True)

    assert b"claim.v1 workers with a fresh heartbeat" in confirm.content and b"SHUT" in confirm.content
    assert b"s ago" in confirm.content
    assert b"GATE_NOT_MET" in refused.content
    assert stage_of("pay") == "LEGACY"


def test_effects_are_approved_and_reconciled_from_the_backlog(ui_operator, operator, worker_a):
    task_id = operator.create(node_id="migrate", replay_policy="NON_REPLAYABLE").json()["task_id"]
    claim = worker_a.claim(task_id).json()
    key = worker_a.prepare(claim, "run", {"v": 2}).json()["effect_id"]

    listed = ui_operator.get("/effects/")
    ui_operator.post(f"/effects/{key}/approve", {"note": "reviewed"})

    assert key.encode() in listed.content
    effect = Effect.objects.get(pk=key)
    assert effect.approved_by == "ui:operator-user"
    assert AuditEntry.objects.filter(action="effect_approve", principal="ui:operator-user").exists()


def test_the_admin_shows_append_only_records_read_only(ready_task, operator):
    from claims.models import TaskEvent

    admin_user = get_user_model().objects.create_superuser("root-admin", "a@example.com", "pw-123456")
    client = Client()
    client.force_login(admin_user)
    event = TaskEvent.objects.first()

    listing = client.get("/admin/claims/taskevent/")
    change = client.post(f"/admin/claims/taskevent/{event.pk}/change/", {"principal": "forged"})
    delete = client.post(f"/admin/claims/taskevent/{event.pk}/delete/", {"post": "yes"})

    assert listing.status_code == 200
    assert change.status_code == 403 and delete.status_code == 403
    assert TaskEvent.objects.get(pk=event.pk).principal != "forged"


def test_a_console_fence_acts_in_its_request_even_while_the_job_queue_is_down(
    ui_oncall, ready_task, monkeypatch
):
    """Issue 24: the fence no longer waits for its job — with the broker down the namespace is fenced by the
    request itself; only the self-check waits, and the page says how to run it by hand."""
    from django.core.management import call_command
    from kombu.exceptions import OperationalError

    from oncall import tasks as oncall_jobs
    from oncall.models import FenceRequest

    def queue_down(*args, **kwargs):
        raise OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    monkeypatch.setattr(oncall_jobs.fence_epoch, "delay", queue_down)  # the broker only; the database is real

    page = ui_oncall.post("/ns/default/fence", {"reason": "incident", "confirm": "default"}, follow=True)

    namespace = Namespace.objects.get(name="default")
    assert (namespace.scheduler_epoch, namespace.claims_paused) == (2, True)  # fenced by the request
    request = FenceRequest.objects.get()
    assert (request.status, request.scheduler_epoch) == (
        "FENCED",
        2,
    )  # the check waits; resend_fences sends it
    assert page.status_code == 200 and b"the job queue is unreachable" in page.content
    assert f"manage.py fence_check {request.fence_id}".encode() in page.content
    assert b'id="resume-form"' in page.content  # Resume is offered on the page the fence answered with

    call_command("fence_check", str(request.fence_id))

    request.refresh_from_db()
    assert request.status == "CHECKED" and request.self_check["ok"] is True
    assert Namespace.objects.get(name="default").scheduler_epoch == 2  # checked, not fenced again


def test_a_fence_form_submitted_twice_fences_once(ui_oncall, default_namespace):
    form = {
        "reason": "double click",
        "confirm": "default",
        "fence_id": "0b7a4a52-8f1e-4d36-9d59-2f1f3a0c9e11",
    }

    ui_oncall.post("/ns/default/fence", form)
    ui_oncall.post("/ns/default/fence", form)

    assert Namespace.objects.get(name="default").scheduler_epoch == 2
    assert AuditEntry.objects.filter(action="epoch_fence").count() == 1


def test_a_console_reconcile_takes_only_the_values_the_api_takes(ui_operator, worker_a, ready_task):
    claim = worker_a.claim(ready_task).json()
    key = worker_a.prepare(claim, "mail", {"to": "ops"}).json()["effect_id"]
    worker_a.outcome(claim, key, "UNKNOWN")

    bogus = ui_operator.post(f"/effects/{key}/reconcile", {"observed": "BOGUS"}, follow=True)
    missing = ui_operator.post(f"/effects/{key}/reconcile", {}, follow=True)

    assert bogus.status_code == 400 and b"INVALID" in bogus.content and b"observed" in bogus.content
    assert missing.status_code == 400
    assert Effect.objects.get(pk=key).state == "UNKNOWN"  # neither moved it (BOGUS once moved it to PREPARED)
    assert not AuditEntry.objects.filter(action="effect_reconcile").exists()


def test_every_console_form_with_a_text_field_has_a_disabled_default_button(ui_oncall, operator, worker_a):
    """Enter in a field submits a form through its default button — the first submit button. A disabled one
    makes Enter do nothing, so a destructive button is only ever pressed on purpose."""
    import re

    claim = worker_a.claim(operator.create().json()["task_id"]).json()
    key = worker_a.prepare(claim, "mail", {"to": "ops"}).json()["effect_id"]
    worker_a.outcome(claim, key, "UNKNOWN")
    Namespace.objects.filter(name="default").update(claims_paused=True)  # the resume form shows

    for path in ("/ns/default/", "/effects/"):
        page = ui_oncall.get(path).content.decode()
        forms = re.findall(r'<form method="post".*?</form>', page, flags=re.S)
        assert forms, path
        for form in forms:
            if 'type="text"' in form:
                first = re.search(r"<button[^>]*>", form).group(0)
                assert 'type="submit"' in first and "disabled" in first, (path, form[:200])


def test_resume_from_the_console_takes_the_api_rule_and_is_audited_with_its_reason(
    ui_oncall, oncall, default_namespace
):
    """claim-v1.md: resume → 200 with nothing required. One rulebook (issue 36): the console no longer refuses
    what the API accepts; a reason given is trimmed and audited."""
    Namespace.objects.filter(name="default").update(claims_paused=True)
    without = ui_oncall.post("/ns/default/resume", {}, follow=True)
    assert not Namespace.objects.get(name="default").claims_paused and b"Resumed" in without.content

    Namespace.objects.filter(name="default").update(claims_paused=True)
    ui_oncall.post("/ns/default/resume", {"reason": "  incident over "})
    assert not Namespace.objects.get(name="default").claims_paused
    entries = AuditEntry.objects.filter(action="namespace_resume").order_by("id")
    assert [(e.principal, e.reason) for e in entries] == [
        ("ui:oncall-user", ""),
        ("ui:oncall-user", "incident over"),
    ]


def test_resume_from_the_console_is_refused_while_a_rollback_holds_the_pause(ui_oncall, default_namespace):
    Namespace.objects.filter(name="default").update(claims_paused=True, pause_hold="rollback:demo")

    refused = ui_oncall.post("/ns/default/resume", {"reason": "one click"}, follow=True)

    assert b"PAUSE_HELD" in refused.content
    assert Namespace.objects.get(name="default").claims_paused


def test_the_console_refuses_a_post_without_its_csrf_token(db, ready_task):
    user = get_user_model().objects.create_user(username="oc", password="pw-123456")
    user.groups.set([Group.objects.get(name="oncall")])
    client = Client(enforce_csrf_checks=True)
    client.login(username="oc", password="pw-123456")

    response = client.post("/ns/default/fence", {"reason": "x", "confirm": "default"})

    assert response.status_code == 403
    assert Namespace.objects.get(name="default").scheduler_epoch == 1


def test_the_effects_backlog_filters_by_namespace_and_keeps_the_filter_after_a_reconcile(
    ui_operator, operator, worker_a
):
    assert operator.post("/namespaces", {"name": "other", "stage": "V1_ONLY"}).status_code == 201
    keys = {}
    for ns in ("default", "other"):
        claim = worker_a.claim(operator.create(namespace=ns).json()["task_id"]).json()
        keys[ns] = worker_a.prepare(claim, "notify", {"ns": ns}).json()["effect_id"]
        worker_a.outcome(claim, keys[ns], "UNKNOWN")

    page = ui_operator.get("/effects/", {"ns": "other"})
    done = ui_operator.post(
        f"/effects/{keys['other']}/reconcile",
        {"observed": "NOT_OCCURRED", "ns": "other", "reason": "no such call in its log", "confirm": "on"},
    )

    assert [e.effect_id for e in page.context["unknown"]] == [keys["other"]]
    assert done.status_code == 302 and done["Location"] == "/effects/?ns=other"
    assert Effect.objects.get(pk=keys["default"]).state == "UNKNOWN"


def test_the_rollout_page_shows_the_import_the_observer_behind_a_lease_and_what_a_rollback_wrote_over(
    viewer, default_namespace
):
    """Issue 34: the table's import with its progress, an observer whose passes end behind legacy by more than a
    lease, and the completions a rollback's write-back overwrote — each on the namespace's page."""
    import uuid

    from claims import clock
    from rollout.models import LegacyImport, ObserverPosition, Rollback, WriteBackDifference

    now = clock.now()
    LegacyImport.objects.create(
        namespace="default", principal="p", total=200, read=50, created=50, started_at=now, updated_at=now
    )
    ObserverPosition.objects.create(
        name="binlog:jobs", judged=7, behind_seconds=12.5, lease_seconds=1.0, updated_at=now
    )
    rollback = Rollback.objects.create(
        rollback_id=uuid.uuid4(),
        namespace="default",
        from_stage="V1_WRITES",
        to_stage="SHADOW",
        step="DONE",
        reason="r",
        principal="p",
        scheduler_epoch=2,
        started_at=now,
        finished_at=now,
    )
    WriteBackDifference.objects.create(
        namespace="default",
        rollback_id=rollback.pk,
        task_id="t-old",
        table={"completed_by": "old-1", "result": 1},
        claim_v1={"state": "READY", "owner_id": "", "result": None},
        written="CLEARED",
        at=now,
    )

    page = viewer.get("/ns/default/").content.decode()

    assert "Import RUNNING: 50 of 200 rows read (25 %)" in page
    assert "ended 12.5 s behind legacy" in page and "behind by more than a lease" in page
    assert "t-old" in page and "completed by old-1" in page and "CLEARED" in page


def test_a_refusal_that_is_not_a_fence_is_not_called_fenced_on_the_timeline(
    ui_operator, operator, worker_a, ready_task
):
    """Issue 36: a refused reconcile (NOT_UNKNOWN) was on the task's timeline as "fenced @effect"."""
    claim = worker_a.claim(ready_task).json()
    key = worker_a.prepare(claim, "mail", {"to": "ops"}).json()["effect_id"]
    early = operator.post(f"/effects/{key}/reconcile", {"observed": "OCCURRED", "reason": "looked"})
    oncall = make_actor("oscar-oncall", "oncall")
    oncall.post("/namespaces/default/fence", {"reason": "drill"})
    late = worker_a.renew(claim)

    page = ui_operator.get(f"/tasks/{ready_task}").content.decode()

    assert early.json()["outcome"] == "NOT_UNKNOWN" and late.json()["outcome"] == "FENCED"
    assert re.search(r"<strong>refused</strong>[^<]*@effect: NOT_UNKNOWN", page)
    assert "@effect: NOT_UNKNOWN" in page and "<strong>fenced</strong>" in page  # the renew was fenced
    assert not re.search(r"<strong>fenced</strong>[^<]*@effect: NOT_UNKNOWN", page)
