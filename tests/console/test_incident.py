"""The incident header and the fence form (issue 14 item 2): every namespace page says the stage, the epoch, since
when claims are paused, by whom and why, the rollback's step and what it waits on, and whether the jobs keep up;
"Fence…" is one step from the overview and the header, and a typo answers the form again with the error beside its
field and the typed text kept."""

from __future__ import annotations

import pytest

from claims.models import Namespace, Principal
from oncall import services as fences
from tests.console.test_pages import login


def test_the_header_says_who_paused_claims_when_and_why(oncall, default_namespace):
    assert oncall.post("/namespaces/default/fence", {"reason": "stale writers at 3 a.m."}).status_code == 200

    incident = login("viewer").get("/ns/default/").context["incident"]

    assert incident["paused"] and incident["epoch"] == 2
    assert (incident["paused_by"].principal, incident["paused_by"].reason) == (
        oncall.name,
        "stale writers at 3 a.m.",
    )


def test_the_header_says_when_the_jobs_are_behind(oncall, default_namespace, db_clock, settings):
    settings.FENCE_RESEND_AFTER_SECONDS = 30
    fences.fence(principal=Principal.objects.get(name=oncall.name), namespace="default", reason="queued")
    fresh = login("viewer").get("/ns/default/", {"part": "live"})
    db_clock.travel(45)

    late = login("operator").get("/ns/default/", {"part": "live"})

    assert fresh.context["incident"]["jobs_behind"] == [] and fresh.context["incident"]["fences_waiting"] == 1
    assert late.context["incident"]["jobs_behind"] == ["a fence's self-check has waited 45 s for its job"]
    assert b"check the Celery workers and beat" in late.content


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_only_oncall_sees_or_uses_the_fence_page(role, default_namespace):
    client = login(role)

    assert client.get("/ns/default/fence").status_code == 403
    assert b'id="header-fence"' not in client.get("/ns/default/").content


def test_a_typo_in_the_confirmation_keeps_the_typed_reason_and_says_so_beside_the_field(default_namespace):
    oncall_ui = login("oncall")
    assert b"Fence\xe2\x80\xa6" in oncall_ui.get("/").content  # one step from the overview row

    typo = oncall_ui.post("/ns/default/fence", {"reason": "runaway worker", "confirm": "defualt"})
    fixed = oncall_ui.post("/ns/default/fence", {"reason": "runaway worker", "confirm": "default"})

    assert typo.status_code == 400
    assert b'value="runaway worker"' in typo.content and b'value="defualt"' in typo.content
    assert (
        b'id="fence-confirm-error"' in typo.content
        and b'aria-describedby="fence-confirm-error"' in typo.content
    )
    assert b'id="fence-reason-error"' not in typo.content
    assert fixed.status_code == 302 and Namespace.objects.get(name="default").scheduler_epoch == 2


def test_the_mismatch_report_carries_the_incident_header_too(oncall, operator):
    assert operator.post("/namespaces", {"name": "shady", "stage": "SHADOW"}).status_code == 201
    assert oncall.post("/namespaces/shady/fence", {"reason": "shadow looks wrong"}).status_code == 200

    page = login("viewer").get("/ns/shady/mismatches")

    assert page.context["incident"]["paused_by"].reason == "shadow looks wrong"
    assert b'id="incident"' in page.content and b"shadow looks wrong" in page.content
