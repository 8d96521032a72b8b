"""The on-call tools as an app of their own (issue 22): they run with the rollout installed and without it (the
Makefile runs this file again with controlplane.settings.test_core, as it runs tests/claims), and the API, the
console and the CLI fence through one service — a durable request, the fence, its self-check, the audit."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.management import call_command
from django.test import Client

from claims.models import AuditEntry, Namespace, Principal, Task
from oncall.models import FenceRequest


def _login(role: str) -> Client:
    user = get_user_model().objects.create_user(username=f"{role}-oncall-tests", password="pw-123456")
    user.groups.set([Group.objects.get(name=role)])
    client = Client()
    assert client.login(username=user.username, password="pw-123456")
    return client


def test_the_api_fence_is_a_durable_request_with_its_self_check(oncall, default_namespace, operator):
    task_id = operator.create().json()["task_id"]

    answer = oncall.post("/namespaces/default/fence", {"reason": "incident 7"})

    assert answer.status_code == 200, answer.json()
    request = FenceRequest.objects.get()
    assert answer.json() == {"outcome": "FENCED_EPOCH", "scheduler_epoch": 2, "claims_paused": True}
    assert answer["Fence-Id"] == str(request.fence_id) and answer["Fence-Self-Check"] == "ok"
    assert request.self_check["ok"] is True and request.scheduler_epoch == 2 and request.finished_at
    assert request.principal == oncall.name
    actions = list(AuditEntry.objects.filter(namespace="default").values_list("action", "principal"))
    assert ("epoch_fence", oncall.name) in actions and ("fence_self_check", oncall.name) in actions
    assert Task.objects.get(pk=task_id).state == "READY"  # the probe's refusal changed nothing


def test_the_api_the_console_and_the_cli_fence_through_one_service(oncall, default_namespace):
    oncall.post("/namespaces/default/fence", {"reason": "api"})
    _login("oncall").post("/ns/default/fence", {"reason": "console", "confirm": "default"})
    call_command("fence", "default", reason="cli", principal=oncall.name)

    requests = FenceRequest.objects.order_by("requested_at")
    assert [(r.reason, r.scheduler_epoch, r.self_check["ok"]) for r in requests] == [
        ("api", 2, True),
        ("console", 3, True),
        ("cli", 4, True),
    ]
    assert Namespace.objects.get(name="default").scheduler_epoch == 4


def test_a_worker_or_an_operator_cannot_fence(worker_a, operator, default_namespace):
    assert worker_a.post("/namespaces/default/fence", {"reason": "x"}).status_code == 403
    assert operator.post("/namespaces/default/fence", {"reason": "x"}).status_code == 403
    assert not FenceRequest.objects.exists()
    assert Namespace.objects.get(name="default").scheduler_epoch == 1


def test_the_on_call_pages_render_and_resume_lifts_the_pause(oncall, default_namespace):
    oncall.post("/namespaces/default/fence", {"reason": "drill"})
    console = _login("oncall")

    pages = {
        path: console.get(path)
        for path in ("/", "/ns/default/incident", "/ns/default/fence", "/pools/", "/glance/")
    }
    resumed = console.post("/ns/default/resume", {"reason": "drill over"})

    assert {path: page.status_code for path, page in pages.items()} == dict.fromkeys(pages, 200)
    assert b"drill" in pages["/ns/default/incident"].content  # its fence, with the self-check
    assert resumed.status_code == 302
    assert not Namespace.objects.get(name="default").claims_paused
    assert AuditEntry.objects.filter(action="namespace_resume", reason="drill over").exists()


def test_the_audit_api_is_the_on_call_apps_and_needs_an_operator(
    oncall, operator, worker_a, default_namespace
):
    oncall.post("/namespaces/default/fence", {"reason": "audited"})

    page = operator.get("/audit").json()

    assert any(row["action"] == "epoch_fence" and row["reason"] == "audited" for row in page["results"])
    assert worker_a.get("/audit").status_code == 403


@pytest.mark.skipif(apps.is_installed("rollout"), reason="the profile without the rollout")
def test_without_the_rollout_the_namespace_pages_are_the_on_call_apps(oncall, default_namespace):
    overview = _login("viewer").get("/")

    assert b'href="/ns/default/incident"' in overview.content
    assert b"Stage" not in overview.content  # no stage column: nothing migrates here
    assert not Principal.objects.filter(role="oncall").exclude(name=oncall.name).exists()
