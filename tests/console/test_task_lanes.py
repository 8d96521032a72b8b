"""A task's history as lanes (issue 14 item 5): one lane per attempt on one time axis with its own marks; an attempt
an epoch fence ended is shown fenced, never holding; the holder is holding; links to the task's mismatches."""

from __future__ import annotations

from tests.console.test_pages import login


def test_a_fenced_attempt_is_shown_fenced_and_the_new_one_holding(
    oncall, worker_a, worker_b, ready_task, db_clock
):
    first = worker_a.claim(ready_task, ttl=60).json()
    worker_a.renew(first)
    assert oncall.post("/namespaces/default/fence", {"reason": "drill"}).status_code == 200
    worker_a.renew(first)  # refused: FENCED EPOCH, a mark on the first lane
    assert oncall.post("/namespaces/default/resume", {"reason": "over"}).status_code == 200
    db_clock.travel(2)
    worker_b.claim(ready_task, epoch=2)

    page = login("viewer").get(f"/tasks/{ready_task}")
    lanes = page.context["history"]["lanes"]

    assert [(lane["attempt"].owner_id, lane["status"]) for lane in lanes] == [
        ("worker-a", "fenced"),
        ("worker-b", "holding"),
    ]
    assert [m["label"] for m in lanes[0]["marks"]] == ["renewed", "refused FENCED EPOCH"]
    assert 0 <= lanes[0]["left"] < lanes[1]["left"] <= 100
    assert b"This task&#x27;s mismatches" in page.content or b"This task's mismatches" in page.content
    assert b'class="lane-row fenced"' in page.content and b'class="lane-row holding"' in page.content


def test_an_unknown_effect_is_reconciled_from_the_tasks_page(worker_a, ready_task):
    from claims.models import Effect

    claim = worker_a.claim(ready_task).json()
    key = worker_a.prepare(claim, "notify", {"n": 1}).json()["effect_id"]
    worker_a.outcome(claim, key, "UNKNOWN")
    ui = login("operator")
    assert b'class="inline reconcile"' in ui.get(f"/tasks/{ready_task}").content

    answer = ui.post(
        f"/effects/{key}/reconcile",
        {"observed": "OCCURRED", "external_ref": "ticket-7", "back_to_task": "1"},
    )

    assert answer.status_code == 302 and answer["Location"] == f"/tasks/{ready_task}"
    assert Effect.objects.get(pk=key).state == "COMMITTED"
