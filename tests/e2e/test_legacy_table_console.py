"""A team's own table in the console, in real headless Chromium (issue 34): an on-call engineer rolls a namespace back
out of V1_WRITES after old binaries completed rows directly in their table, and the rollout page lists each completion
the write-back wrote over, beside the import of the table's rows; after a fence where legacy decides, the incident
header says plainly that legacy still holds its own lease and that the drain waits for it."""

from __future__ import annotations

import pytest
from django.db import connections

from claims.models import Namespace, Task
from rollout.models import WriteBackDifference
from tests.e2e.test_console import log_in, ui_user
from tests.support.actors import make_actor
from tests.support.legacy_db import NS, Their, row, task_in_both, their_table_configured

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "legacy"]),
    pytest.mark.skipif(
        "legacy" not in connections, reason="no second PostgreSQL database (the PostgreSQL run adds one)"
    ),
]


@pytest.fixture
def their():
    db = Their("legacy")
    db.create_jobs()
    with their_table_configured("legacy"):
        yield db
    db.sql("DROP TABLE IF EXISTS jobs")


def test_an_oncall_rolls_back_and_sees_what_the_write_back_wrote_over(
    page, live_server, shot, their, worker_a
):
    ui_user("otto", "oncall")
    operator = make_actor("api-operator", "operator")
    assert operator.post("/namespaces", {"name": NS, "stage": "V1_WRITES"}).status_code == 201
    committed, direct = task_in_both(operator, their), task_in_both(operator, their)
    claim = worker_a.claim(committed).json()
    assert worker_a.commit(claim, {"r": "v1"}, inline=True).status_code == 200
    their.sql(  # an old binary that was not stopped completes a row straight in their table
        "UPDATE jobs SET output = %s, finished_by = 'old-bin' WHERE job_id = %s", ['{"r": "old"}', direct]
    )

    log_in(page, live_server, "otto")
    page.goto(f"{live_server.url}/ns/{NS}/")
    page.locator("#rollback-to").select_option("SHADOW")
    page.locator("#rollback-reason").fill("old pool still running")
    page.get_by_label("Finish without a clean drain").check()
    page.get_by_label("I understand: if I force it, in-flight work is lost").check()
    page.get_by_role("button", name="Roll back").click()
    page.goto(f"{live_server.url}/ns/{NS}/")

    listed = page.locator("#written-over-table").inner_text()
    assert direct in listed and "completed by old-bin" in listed and "CLEARED" in listed
    shot(page, "22-rollback-wrote-over")
    assert row(their, direct)[2:4] == (None, None)  # cleared in their table: claimable again there
    assert Task.objects.get(pk=direct).state == "READY"
    assert WriteBackDifference.objects.get().task_id == direct

    # Resumed in SHADOW, a claim.v1 worker takes a lease that legacy records too; then a fence.
    assert (
        make_actor("oncall-api", "oncall").post(f"/namespaces/{NS}/resume", {"reason": "done"}).status_code
        == 200
    )
    held = task_in_both(operator, their)
    epoch = Namespace.objects.get(name=NS).scheduler_epoch  # the rollback's fence moved it
    assert worker_a.claim(held, epoch=epoch, ttl=200).status_code == 200
    page.goto(f"{live_server.url}/ns/{NS}/fence")
    page.locator("#fence-reason").fill("incident")
    page.locator("#fence-confirm").fill(NS)
    page.get_by_role("button", name="Fence the epoch").click()
    page.goto(f"{live_server.url}/ns/{NS}/incident")
    note = page.locator("#legacy-note").inner_text()
    assert "legacy keeps its own until they expire — 1 live in it now, and the drain waits for them" in note
