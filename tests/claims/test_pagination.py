"""Lists in DRF's shape at a bounded cost (issue 13 item 7): ``count`` exact up to API_LIST_COUNT_CAP, then the cap
with ``X-Count-Capped: true``; ``next`` leads on to every later page; a page past the last is a 404."""

from __future__ import annotations

from claims.models import Principal, Task
from claims.services import task_create


def _tasks(operator, n: int) -> list[str]:
    principal = Principal.objects.get(name=operator.name)
    return [
        task_create(principal=principal, namespace="default", node_id="n", input={"i": i}).task.task_id
        for i in range(n)
    ]


def test_a_short_list_is_counted_exactly(operator, default_namespace):
    made = _tasks(operator, 7)

    page = operator.get("/tasks", page_size=5)
    last = operator.get("/tasks", page_size=5, page=2)

    assert page.json()["count"] == 7 and last.json()["count"] == 7
    assert [t["task_id"] for t in page.json()["results"] + last.json()["results"]] == made
    assert "page=2" in page.json()["next"]
    assert last.json()["next"] is None and last.json()["previous"] is not None
    assert "X-Count-Capped" not in page.headers
    assert operator.get("/tasks", page_size=5, page=3).status_code == 404
    assert operator.get("/tasks", page="x").status_code == 404
    assert operator.get("/tasks", page=str(10**20)).status_code == 404  # not a database error


def test_past_the_cap_the_count_is_the_cap_and_says_so_and_next_still_leads_on(
    operator, default_namespace, settings
):
    settings.API_LIST_COUNT_CAP = 10
    made = _tasks(operator, 23)

    pages, url = [], "/tasks?page_size=10"
    first = operator.get("/tasks", page_size=10)
    while url:
        answer = operator.client.get(url if url.startswith("http") else f"/api/v1{url}")
        pages.append(answer)
        url = answer.json()["next"]

    assert first.json()["count"] == 10 and first.headers["X-Count-Capped"] == "true"
    assert [t["task_id"] for p in pages for t in p.json()["results"]] == made
    assert pages[-1].json()["count"] == 23  # the last page shows where the list ends: exact again
    assert Task.objects.count() == 23
