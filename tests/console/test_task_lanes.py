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


def test_a_lane_ends_where_its_lease_ran_out_not_where_the_task_was_reclaimed(
    worker_a, worker_b, ready_task, db_clock
):
    """Issue 24: an attempt reclaimed 2.6 s after its lease ran out was drawn as holding until the reclaim."""
    first = worker_a.claim(ready_task, ttl=2).json()
    worker_a.renew(first, extend_seconds=3)  # the lease now runs out 3 s after the renewal
    db_clock.travel(5.6)
    worker_b.claim(ready_task)  # a reclaim, 2.6 s after the expiry

    lanes = login("viewer").get(f"/tasks/{ready_task}").context["history"]["lanes"]

    assert [(lane["attempt"].owner_id, lane["status"]) for lane in lanes] == [
        ("worker-a", "reclaimed"),
        ("worker-b", "holding"),
    ]
    assert 2.9 <= lanes[0]["held_seconds"] <= 3.5  # held until its renewed lease ran out, not 5.6 s
    assert lanes[0]["left"] + lanes[0]["width"] < lanes[1]["left"]  # a gap: nobody held it in between


def test_in_shadow_the_page_says_the_api_answers_legacys_record_and_shows_it(operator):
    from tests.support.actors import make_actor

    assert operator.post("/namespaces", {"name": "shadowed", "stage": "SHADOW"}).status_code == 201
    task_id = operator.create(namespace="shadowed").json()["task_id"]
    legacy = make_actor("lee-legacy", "worker", "legacy")
    legacy.client.post(
        f"/api/legacy/tasks/{task_id}/claim", {"owner_id": legacy.name, "ttl_seconds": 300}, format="json"
    )
    api = operator.get(f"/tasks/{task_id}").json()

    page = login("viewer").get(f"/tasks/{task_id}")

    (note,) = page.context["notes"]
    assert api["read_from"] == "legacy" and note["store"] == "legacy"
    assert (
        (note["record"]["state"], note["record"]["owner"])
        == (api["state"], api["owner_id"])
        == (
            "CLAIMED",
            "lee-legacy",
        )
    )
    assert (
        b"The API answers legacy&#x27;s record." in page.content
        or b"The API answers legacy's record." in page.content
    )
    assert b"not the one the API answers in this stage" in page.content


def test_from_v1_reads_on_the_page_shows_the_record_the_api_answers_without_a_note(operator, ready_task):
    page = login("viewer").get(f"/tasks/{ready_task}")

    assert page.context["notes"] == [] and b"claim.v1's record" in page.content
