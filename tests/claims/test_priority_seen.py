"""Priority and fair share, seen (issue 40, point 6): the backlog by priority and by the largest keys on /metrics
(bounded: the largest keys and "(other)"), each key's share of the last minutes' grants on the namespace page, and
the operator's priority change in the console — audited, refused with the field named, and never a write on a GET."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from claims.models import AuditEntry, Task, TaskEvent
from claims.queues import TOP_KEYS
from tests.support.backlog import backlog
from tests.support.console import login

pytestmark = pytest.mark.django_db


def _samples(text: str, family: str, *names: str) -> dict[tuple[str, ...], float]:
    """The family's samples by the values of the labels ``names``, in that order."""
    found = {}
    for labels, value in re.findall(rf"^{family}\{{(.*?)\}} (\S+)$", text, re.M):
        values = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        found[tuple(values[name] for name in names)] = float(value)
    return found


def test_metrics_carry_the_backlog_by_priority_and_the_largest_keys_only(operator):
    for k in range(TOP_KEYS + 5):
        backlog(k + 1, key=f"tenant-{k:02d}")
    operator.create(task_id="urgent", priority=1)

    text = Client().get("/metrics").content.decode()

    assert _samples(text, "claims_ready_tasks", "namespace", "priority") == {
        ("default", "1"): 1,
        ("default", "3"): sum(range(1, TOP_KEYS + 6)),
    }
    by_key = _samples(text, "claims_ready_tasks_by_key", "namespace", "key")
    assert len(by_key) == TOP_KEYS + 1  # bounded, however many keys
    assert by_key[("default", "tenant-14")] == 15 and ("default", "tenant-00") not in by_key
    assert by_key[("default", "(other)")] == sum(range(1, 6)) + 1  # the 5 smallest keys and "" (urgent)
    assert sum(by_key.values()) == Task.objects.filter(state="READY").count()


def test_the_namespace_page_shows_each_keys_share_of_the_last_grants(operator, worker_a):
    backlog(30, key="big", weight=3)
    for n in range(10):
        operator.create(task_id=f"small-{n}", fairness_key="small")
    assert worker_a.claim_batch(20).status_code == 200
    rows = TaskEvent.objects.count()

    page = login("viewer").get("/ns/default/incident").content.decode()

    assert "Grants of the last 5 minutes, by key" in page
    big = re.search(r"<th scope=\"row\">big</th><td>(\d+)</td><td>(\d+) %</td><td>3.0</td>", page)
    small = re.search(r"<th scope=\"row\">small</th><td>(\d+)</td><td>(\d+) %</td><td>1.0</td>", page)
    assert big and small, page
    assert int(big[1]) + int(small[1]) == 20 and abs(int(small[1]) - 5) <= 1
    assert TaskEvent.objects.count() == rows  # a GET writes nothing


def test_an_operator_changes_a_priority_in_the_console(operator):
    operator.create(task_id="t")
    console = login("operator")
    assert "Change the priority" in console.get("/tasks/t").content.decode()

    refused = console.post("/tasks/t/priority", {"priority": "9", "reason": "x"})
    assert refused.status_code == 400 and "A whole number from 1" in refused.content.decode()
    assert Task.objects.get(pk="t").priority == 3
    done = console.post("/tasks/t/priority", {"priority": "1", "reason": "the customer is waiting"})
    assert done.status_code == 302
    assert Task.objects.get(pk="t").priority == 1
    audit = AuditEntry.objects.get(action="task_set_priority")
    assert (audit.principal, audit.reason) == ("ui:operator-user", "the customer is waiting")
    assert "Change the priority" not in login("viewer").get("/tasks/t").content.decode()


def _exact_by_key() -> dict[str, int]:
    from django.db.models import Count

    return dict(Task.objects.filter(state="READY").values_list("fairness_key").annotate(n=Count("*")))


def test_the_keys_backlogs_read_from_their_lanes_are_the_exact_counts_while_tasks_leave_in_order(
    operator, worker_a
):
    """Each key's waiting tasks are read from its lanes (one row a key, not one a task): the figures on /metrics and
    the namespace page equal the tasks' own count, before and after grants, with weights 3, 1 and 0.5."""
    from claims.queues import backlogs

    backlog(40, key="big", weight=3)
    backlog(7, key="small")
    backlog(5, key="slow", weight=0.5)
    for n in range(4):
        operator.create(task_id=f"late-{n}", fairness_key="small")
    for granted in (0, 9, 13, 20):
        if granted:
            assert worker_a.claim_batch(granted).status_code == 200
        assert dict(backlogs()["default"].by_key) == _exact_by_key(), granted
    page = login("viewer").get("/ns/default/incident").content.decode()
    assert f'<th scope="row">big</th><td>{_exact_by_key()["big"]}</td>' in page


def test_past_the_cap_a_backlog_is_its_keys_schedules_and_below_it_the_exact_count(operator, settings):
    """A scrape counts a namespace's READY tasks of one priority up to CLAIMS_BACKLOG_COUNT_CAP (a range of the
    READY index, stopped there); past it, the gauge is the sum of its keys' schedules — which still counts the
    places of tasks cancelled before their turn — and below it the exact count, no key shown above it."""
    ids = backlog(30, key="a")
    backlog(3, key="b", priority=2)
    Task.objects.filter(pk__in=ids[10:13]).update(state="CANCELLED")  # three holes in key a's schedule

    settings.CLAIMS_BACKLOG_COUNT_CAP = 20
    past = Client().get("/metrics").content.decode()
    settings.CLAIMS_BACKLOG_COUNT_CAP = 1_000
    below = Client().get("/metrics").content.decode()

    assert _samples(past, "claims_ready_tasks", "namespace", "priority") == {
        ("default", "2"): 3,
        ("default", "3"): 30,
    }
    assert _samples(past, "claims_ready_tasks_by_key", "namespace", "key") == {
        ("default", "a"): 30,
        ("default", "b"): 3,
    }
    assert _samples(below, "claims_ready_tasks", "namespace", "priority") == {
        ("default", "2"): 3,
        ("default", "3"): 27,
    }
    assert _samples(below, "claims_ready_tasks_by_key", "namespace", "key") == {
        ("default", "a"): 27,
        ("default", "b"): 3,
    }


def test_a_scrape_reads_the_same_statements_whatever_the_backlog(operator):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from claims.queues import backlogs

    def statements() -> int:
        with CaptureQueriesContext(connection) as seen:
            backlogs()
        return len(seen.captured_queries)

    backlog(10, key="a")
    few = statements()
    backlog(5_000, key="b")
    backlog(5_000, key="c", priority=1)
    assert statements() == few == 2
