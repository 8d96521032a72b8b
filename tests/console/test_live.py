"""The namespace page's live region (issue 14 item 1): ``?part=live`` answers the region alone — what htmx polls —
with the time its data was taken; the Fences table has every fence, whatever path made it; a stale drain snapshot
is marked; the forward gate and Advance are hidden while a rollback is under way."""

from __future__ import annotations

from datetime import timedelta

from django.core.management import call_command

from claims import clock
from rollout.models import DrainSnapshot
from rollout.tasks import gate_check
from tests.console.test_pages import login
from tests.support.actors import make_actor


def test_the_live_region_answers_alone_with_the_time_its_data_was_taken(oncall, default_namespace):
    viewer = login("viewer")
    assert oncall.post("/namespaces/default/fence", {"reason": "from the API"}).status_code == 200

    region = viewer.get("/ns/default/", {"part": "live"})
    page = viewer.get("/ns/default/")

    assert region.status_code == 200 and b"<html" not in region.content
    assert b'id="live"' in region.content and b'hx-trigger="every 3s"' in region.content
    assert b'<strong id="epoch">2</strong>' in region.content and b"data taken at" in region.content
    assert b'id="fence-form"' not in region.content  # the forms stay out of the region: typing is never lost
    assert b'id="live"' in page.content and b"htmx-2.0.11.min.js" in page.content


def test_the_fences_table_lists_fences_from_the_api_the_cli_and_the_console(oncall, default_namespace):
    oncall_ui = login("oncall")
    assert oncall.post("/namespaces/default/fence", {"reason": "from the API"}).status_code == 200
    call_command("fence", "default", reason="from the CLI", principal=oncall.name)
    oncall_ui.post("/ns/default/fence", {"reason": "from the console", "confirm": "default"})

    fences = oncall_ui.get("/ns/default/", {"part": "live"}).context["fences"]

    assert [(f["reason"], f["epoch"]) for f in fences] == [
        ("from the console", 4),
        ("from the CLI", 3),
        ("from the API", 2),
    ]
    # Issue 22: the API fences through the same durable request and self-check as the console and the CLI.
    assert all(f["request"] is not None and f["request"].self_check["ok"] for f in fences)


def test_a_drain_snapshot_older_than_two_intervals_is_marked_stale(default_namespace, settings):
    settings.DRAIN_INTERVAL_SECONDS = 15
    DrainSnapshot.objects.create(
        namespace="default", pool="", active_leases=0, unknown_effects=0, awaiting_commit=0,
        is_clean=True, clean_streak=1, taken_at=clock.now() - timedelta(seconds=31),
    )  # fmt: skip

    region = login("viewer").get("/ns/default/", {"part": "live"})

    assert region.context["stale_drains"] == {"whole namespace"}
    assert b"stale: the drain check has not run lately" in region.content


def test_during_a_rollback_the_forward_gate_and_advance_are_hidden(operator, oncall):
    assert operator.post("/namespaces", {"name": "rolling", "stage": "SHADOW"}).status_code == 201
    claimant = operator.create(namespace="rolling").json()["task_id"]
    legacy = make_actor("lee-legacy", "worker", "legacy")
    legacy.client.post(
        f"/api/legacy/tasks/{claimant}/claim", {"owner_id": legacy.name, "ttl_seconds": 300}, format="json"
    )
    gate_check("rolling")  # the SHADOW → V1_READS gate has a recorded evaluation to show (or hide)
    assert b'id="gate"' in login("viewer").get("/ns/rolling/", {"part": "live"}).content
    started = oncall.post(
        "/namespaces/rolling/rollout/rollback", {"to_stage": "LEGACY", "reason": "bad shadow"}
    )
    assert started.status_code == 202, started.content  # waits for the legacy lease to drain

    region = login("operator").get("/ns/rolling/", {"part": "live"})

    assert b'id="rollback-open"' in region.content
    assert b'id="advance-link"' not in region.content and b'id="gate"' not in region.content


def test_after_a_rollback_every_figure_is_in_the_live_region_and_the_old_gate_is_history(
    operator, oncall, settings, db_clock
):
    """Issue 24: after a rollback the live top said "no traffic" while the table below, outside the refresh, still
    showed the old window's 100 % and the old forward gate read HOLDS. Every figure is now in the region htmx
    refreshes, and a gate recorded before the current stage began is history, not the gate now."""
    settings.ROLLOUT_MIN_SAMPLES = 1
    assert operator.post("/namespaces", {"name": "back", "stage": "V1_WRITES"}).status_code == 201
    from rollout.services.stages import drain_snapshot

    settings.DRAIN_INTERVAL_SECONDS = 1
    for _ in range(2):
        drain_snapshot(
            namespace="back", pool="legacy"
        )  # two clean snapshots apart: the gate out of V1_WRITES holds
        db_clock.travel(1.1)
    gate_check("back")
    rolled = oncall.post("/namespaces/back/rollout/rollback", {"to_stage": "V1_READS", "reason": "drill"})
    assert rolled.status_code == 200, rolled.content

    region = login("viewer").get("/ns/back/", {"part": "live"})

    rows = {row["move"]: row for row in region.context["last_gates"]}
    assert rows["V1_WRITES → V1_ONLY"]["g"].holds and not rows["V1_WRITES → V1_ONLY"]["current"]
    html = region.content.decode()
    assert "history, not the gate now" in html and "HOLDS ✓" not in html.split("Every gate")[1]
    for figure in ("Validation coverage", "Stage history", "V1_WRITES → V1_READS"):
        assert figure in html  # in the refreshed region itself


def test_every_page_with_the_incident_header_polls_it_and_says_how_old_it_is(oncall, operator):
    """Issue 36: fenced through the API, the fence form, the mismatch report and the incident page still said
    "open", epoch 2, 8 s later, with nothing marking them as old. Each now polls the header (``?part=header``)."""
    assert operator.post("/namespaces", {"name": "hdr", "stage": "SHADOW"}).status_code == 201
    ui = login("oncall")
    pages = [ui.get(path) for path in ("/ns/hdr/fence", "/ns/hdr/mismatches", "/ns/hdr/incident")]
    assert oncall.post("/namespaces/hdr/fence", {"reason": "stale writer"}).status_code == 200

    header = ui.get("/ns/hdr/incident", {"part": "header"})

    for page in pages:
        assert page.status_code == 200
        assert b'hx-get="/ns/hdr/incident?part=header"' in page.content and b"as of <time" in page.content
        assert b'<strong id="epoch">1</strong>' in page.content
    assert header.status_code == 200 and b"<html" not in header.content
    assert b'<strong id="epoch">2</strong>' in header.content and b'id="paused">PAUSED' in header.content
    assert b"stale writer" in header.content and b"as of <time" in header.content


def test_the_rollback_form_follows_the_stage_and_is_not_redrawn_while_it_holds(oncall, operator):
    """Issue 36: the Rollback "Back to" list was as of page load. ``?part=rollback`` answers the form for the
    stage now; 204 (htmx keeps what is there) while the stage and open rollback are as the page shows them."""
    assert operator.post("/namespaces", {"name": "back", "stage": "V1_WRITES"}).status_code == 201
    ui = login("oncall")
    first = ui.get("/ns/back/", {"part": "rollback"})
    key = first.context["rollback_key"]
    same = ui.get("/ns/back/", {"part": "rollback", "shown": key, "to_stage": "SHADOW"})
    assert (
        oncall.post("/namespaces/back/rollout/rollback", {"to_stage": "SHADOW", "reason": "x"}).status_code
        == 200
    )

    moved = ui.get("/ns/back/", {"part": "rollback", "shown": key, "to_stage": "SHADOW"})

    assert first.status_code == 200 and b"<option >V1_READS</option>" in first.content
    assert same.status_code == 204 and same.content == b""
    assert moved.status_code == 200 and b"V1_READS</option>" not in moved.content
    assert b"<option selected>SHADOW</option>" not in moved.content  # SHADOW is the stage now, not offered
    assert (
        b"<option >LEGACY</option>" in moved.content
        and b"Offered for stage <strong>SHADOW</strong>" in moved.content
    )
