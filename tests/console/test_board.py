"""The overview as the incident board (issue 24, point 3): per namespace, live, the stage, epoch, who paused it
and why, the gate's verdict, the rollback's step and what it waits on (linked), pending self-checks and jobs
behind — those in trouble first — with Fence and Resume on each card for on-call."""

from __future__ import annotations

from claims.models import AuditEntry, Namespace
from oncall import tasks as oncall_jobs
from rollout.tasks import gate_check
from tests.console.test_pages import login
from tests.support.actors import make_actor


def _card(rows: list[dict], name: str) -> dict:
    return next(row for row in rows if row["ns"].name == name)


def test_the_board_puts_the_namespace_in_trouble_first_with_what_it_waits_on(
    operator, oncall, settings, monkeypatch
):
    monkeypatch.setattr(
        oncall_jobs.fence_epoch, "delay", lambda *a, **k: None
    )  # the self-check's job never runs
    settings.ROLLOUT_MIN_SAMPLES = 10**6
    for name, stage in (("aaa-steady", "V1_ONLY"), ("mmm-shadow", "SHADOW"), ("zzz-rolling", "V1_READS")):
        assert operator.post("/namespaces", {"name": name, "stage": stage}).status_code == 201
    gate_check("mmm-shadow")
    task_id = operator.create(namespace="zzz-rolling").json()["task_id"]
    legacy = make_actor("zzz-legacy", "worker", "legacy")
    legacy.client.post(
        f"/api/legacy/tasks/{task_id}/claim", {"owner_id": legacy.name, "ttl_seconds": 300}, format="json"
    )
    assert (
        oncall.post(
            "/namespaces/zzz-rolling/rollout/rollback", {"to_stage": "SHADOW", "reason": "bad"}
        ).status_code
        == 202
    )
    ui = login("oncall")
    ui.post("/ns/aaa-steady/fence", {"reason": "stale writers", "confirm": "aaa-steady"})

    board = ui.get("/", {"part": "live"})

    assert board.status_code == 200 and b"<html" not in board.content and b'id="board"' in board.content
    rows = board.context["rows"]
    assert [row["ns"].name for row in rows][:2] == ["aaa-steady", "zzz-rolling"]  # trouble first, by name
    steady, rolling, shadow = (_card(rows, n) for n in ("aaa-steady", "zzz-rolling", "mmm-shadow"))
    assert steady["trouble"] == ["claims paused"] and steady["fences_waiting"] == 1
    assert (steady["paused_by"].principal, steady["paused_by"].reason) == ("ui:oncall-user", "stale writers")
    assert steady["epoch"] == Namespace.objects.get(name="aaa-steady").scheduler_epoch == 2
    assert rolling["rollback"].step == "DRAINING" and rolling["rollback_waits_on"]["active_leases"] == 1
    assert "rollback under way" in rolling["trouble"]
    assert shadow["gate"].move == "SHADOW → V1_READS" and not shadow["gate"].holds and not shadow["trouble"]
    html = board.content.decode()
    assert 'href="/pools/?ns=zzz-rolling"' in html and 'href="/effects/?ns=zzz-rolling"' in html
    assert 'aria-label="Fence mmm-shadow…"' in html and 'id="resume-reason-aaa-steady"' in html
    assert "1 self-check pending" in html and "SHUT" in html


def test_on_call_resumes_from_the_board_and_a_viewer_sees_no_actions(oncall, default_namespace):
    assert oncall.post("/namespaces/default/fence", {"reason": "drill"}).status_code == 200
    viewer = login("viewer").get("/")
    assert b"Fence default" not in viewer.content and b"resume-reason-default" not in viewer.content

    resumed = login("oncall").post("/ns/default/resume", {"reason": "drill over", "back": "board"})

    assert resumed.status_code == 302 and resumed["Location"] == "/"
    assert Namespace.objects.get(name="default").claims_paused is False
    assert AuditEntry.objects.filter(action="namespace_resume", reason="drill over").exists()


def test_the_board_orders_trouble_by_urgency_before_name(operator):
    """Issue 36: the namespace with a stale writer was third, below the fold at 390 px, because cards in trouble were
    sorted by name. Now: a stale writer's accepted commit first, then the oldest unexplained mismatch."""
    from datetime import timedelta

    from claims import clock
    from rollout.models import Mismatch

    for name in ("aaa-young", "mmm-old", "zzz-stale"):
        assert operator.post("/namespaces", {"name": name, "stage": "SHADOW"}).status_code == 201
    now = clock.now()
    for name, reason, age in (
        ("aaa-young", "WINNER_DIFFERS", 10),
        ("mmm-old", "WINNER_DIFFERS", 3600),
        ("zzz-stale", "STALE_COMMIT_ACCEPTED", 5),
    ):
        Mismatch.objects.create(
            namespace=name, task_id=operator.create(namespace=name).json()["task_id"], operation="complete",
            api="legacy", legacy={}, v1={}, reason=reason, at=now - timedelta(seconds=age),
        )  # fmt: skip

    rows = login("viewer").get("/", {"part": "live"}).context["rows"]

    assert [row["ns"].name for row in rows][:3] == ["zzz-stale", "mmm-old", "aaa-young"]
    assert (
        _card(rows, "zzz-stale")["stale_writers"] == 1
        and _card(rows, "mmm-old")["oldest_mismatch_age"] >= 3600
    )


def test_a_rollback_whose_drain_does_not_move_comes_before_older_mismatches(operator, oncall, settings):
    """Issue 36: the board's urgency names a drain that does not move. A rollback waiting on a lease that is not
    going away (the drain's outstanding work flat for 4 intervals) comes before a namespace with an hour-old
    mismatch — claims stay paused until the rollback ends — and says so on its card."""
    from datetime import timedelta

    from claims import clock
    from rollout.models import DrainSnapshot, Mismatch, Rollback

    settings.DRAIN_INTERVAL_SECONDS = 15
    for name, stage in (("aaa-mismatch", "SHADOW"), ("zzz-stuck", "SHADOW"), ("mmm-moving", "SHADOW")):
        assert operator.post("/namespaces", {"name": name, "stage": stage}).status_code == 201
    now = clock.now()
    Mismatch.objects.create(
        namespace="aaa-mismatch", task_id=operator.create(namespace="aaa-mismatch").json()["task_id"],
        operation="complete", api="legacy", legacy={}, v1={}, reason="WINNER_DIFFERS", at=now - timedelta(hours=1),
    )  # fmt: skip
    for name, figures in (("zzz-stuck", [3, 3, 3, 3, 3, 3]), ("mmm-moving", [6, 5, 4, 3, 2, 1])):
        # A rollback draining (its record as stages.rollback leaves it while it waits), and its drain checks.
        Rollback.objects.create(
            namespace=name, from_stage="SHADOW", to_stage="LEGACY", step="DRAINING", reason="drill",
            principal=oncall.name, scheduler_epoch=2, started_at=now,
        )  # fmt: skip
        for i, outstanding in enumerate(figures):
            DrainSnapshot.objects.create(
                namespace=name, pool="", active_leases=outstanding, unknown_effects=0, awaiting_commit=0,
                is_clean=False, clean_streak=0, taken_at=now + timedelta(seconds=15 * i),
            )  # fmt: skip

    rows = login("viewer").get("/", {"part": "live"}).context["rows"]

    assert [row["ns"].name for row in rows][:3] == ["zzz-stuck", "aaa-mismatch", "mmm-moving"]
    assert (
        _card(rows, "zzz-stuck")["drain_stalled_for"] == 75
        and _card(rows, "mmm-moving")["drain_stalled_for"] is None
    )
    assert "its drain has not moved for 1 min" in _card(rows, "zzz-stuck")["trouble"]
