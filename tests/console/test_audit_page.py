"""The audit page (issue 14 item 6): every fence — from the API, the console, the CLI — and the resume, with
principal, reason and time; filtered by namespace, action and principal; operators and oncall only."""

from __future__ import annotations

from django.core.management import call_command

from claims.models import AuditEntry
from tests.console.test_pages import login


def test_the_audit_page_lists_fences_from_every_path_and_filters_them(oncall, default_namespace):
    operator_ui, oncall_ui, viewer = login("operator"), login("oncall"), login("viewer")
    assert oncall.post("/namespaces/default/fence", {"reason": "from the API"}).status_code == 200
    assert oncall.post("/namespaces/default/resume", {"reason": "api drill over"}).status_code == 200
    oncall_ui.post("/ns/default/fence", {"reason": "from the console", "confirm": "default"})
    oncall.post("/namespaces/default/resume", {"reason": "console drill over"})
    call_command("fence", "default", reason="from the CLI", principal=oncall.name)

    everything = operator_ui.get("/audit/")
    fences = operator_ui.get("/audit/", {"action": "epoch_fence"})
    by_api_user = operator_ui.get("/audit/", {"principal": oncall.name, "action": "epoch_fence"})
    elsewhere = operator_ui.get("/audit/", {"namespace": "elsewhere"})

    assert everything.status_code == 200 and viewer.get("/audit/").status_code == 403
    listed = [(e.action, e.reason) for e in everything.context["entries"]]
    assert len(listed) == AuditEntry.objects.count()
    fence_reasons = {e.reason for e in fences.context["entries"]}
    assert fence_reasons == {"from the API", "from the console", "from the CLI"}
    assert {e.action for e in fences.context["entries"]} == {"epoch_fence"}
    assert {e.reason for e in by_api_user.context["entries"]} == {"from the API", "from the CLI"}
    assert ("namespace_resume", "api drill over") in listed
    assert elsewhere.context["entries"] == [] and b"that matches the filter" in elsewhere.content
    assert b"from the console" in fences.content and b"epoch_fence" in fences.content


def test_the_audit_page_pages_back_by_id(oncall, default_namespace, settings):
    from claims import selectors

    operator_ui = login("operator")
    for i in range(selectors.AUDIT_PAGE + 5):
        oncall.post("/namespaces/default/resume", {"reason": f"resume {i}"})

    first = operator_ui.get("/audit/", {"action": "namespace_resume"})
    older = operator_ui.get("/audit/", {"action": "namespace_resume", "before": first.context["older"]})

    assert len(first.context["entries"]) == selectors.AUDIT_PAGE and first.context["older"]
    assert len(older.context["entries"]) == 5 and older.context["older"] is None
    seen = [e.id for e in first.context["entries"] + older.context["entries"]]
    assert seen == sorted(seen, reverse=True) and len(set(seen)) == len(seen)
    assert operator_ui.get("/audit/", {"before": str(10**20)}).status_code == 200  # no bigint: the first page


def test_the_control_actions_are_not_buried_under_the_work_records(oncall, operator, default_namespace):
    """Issue 24: ~3,000 task-creation rows buried ~60 control actions. The page shows the control actions unless
    the work's own records are asked for."""
    for _ in range(60):
        operator.create()
    assert oncall.post("/namespaces/default/fence", {"reason": "stale writers"}).status_code == 200

    ui = login("operator")
    control = ui.get("/audit/")
    everything = ui.get("/audit/", {"work": "1"})
    asked = ui.get("/audit/", {"action": "task_create"})

    actions = [e.action for e in control.context["entries"]]
    assert "task_create" not in actions and {"epoch_fence", "fence_self_check"} <= set(actions)
    assert len(actions) == AuditEntry.objects.exclude(action="task_create").count()
    assert [e.action for e in everything.context["entries"]].count("task_create") == 60
    assert len(asked.context["entries"]) == 60
