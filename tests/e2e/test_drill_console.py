"""The drill in the console (issue 23, point 5): the example legacy application's workers write their MariaDB table
directly, the polling observer follows it, and the stale overwrite (A16) happens. An operator, in real headless
Chromium, sees the gate out of SHADOW shut on it, finds the mismatch on the report (which says the table is polled,
and what polling misses), explains it from its timelines, sees the gate's reason go, and advances the namespace to V1_READS."""

from __future__ import annotations

import time

import pytest
from django.db import connections

from examples.legacy_jobs.app import SCHEMA, DirectWorker
from rollout.models import Mismatch
from rollout.services import poll
from rollout.tasks import gate_check
from tests.e2e.test_console import advance_in_ui, log_in, ui_user
from tests.support.actors import make_actor
from tests.support.legacy_db import Their, task_in_both, their_table_configured
from tests.support.legacy_db import connect as _connect
from tests.support.rollout import stage_of

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=["default", "legacy_mysql"]),
    pytest.mark.skipif(
        "legacy_mysql" not in connections, reason="no MariaDB (LEGACY_MYSQL_URL; .ci/run sets it)"
    ),
]
NS = "drill-a16"


def test_an_operator_follows_the_drill_in_the_console(page, live_server, shot, settings):
    their = Their("legacy_mysql")
    their.sql("DROP TABLE IF EXISTS jobs")
    their.sql(SCHEMA["mysql"])
    settings.LEGACY_POLL_MARGIN_SECONDS = 0
    settings.ROLLOUT_MIN_SAMPLES = 1
    ui_user("olivia", "operator")
    operator = make_actor("api-operator", "operator")
    try:
        with their_table_configured("legacy_mysql", changed="changed_at"):
            assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201
            job = task_in_both(operator, their, NS)
            poll.setup()
            stale = DirectWorker(lambda: _connect("legacy_mysql"), "mysql", "stale-w", ttl=1)
            fresh = DirectWorker(lambda: _connect("legacy_mysql"), "mysql", "fresh-w", ttl=30)
            assert stale.claim(job)
            poll.poll_once()
            time.sleep(1.3)
            assert fresh.claim(job)
            poll.poll_once()
            stale.complete(job, {"by": "stale-w"})
            poll.poll_once()
            stale.close(), fresh.close()
            gate_check.delay(NS).get()
            mismatch = Mismatch.objects.get(reason="STALE_COMMIT_ACCEPTED")

            log_in(page, live_server, "olivia")
            page.goto(f"{live_server.url}/ns/{NS}/")
            gate = page.locator("body").inner_text()
            assert "SHADOW → V1_READS" in gate and "mismatches await review" in gate
            shot(page, "20-drill-gate-shut")
            page.goto(f"{live_server.url}/ns/{NS}/mismatches")
            report = page.locator("body").inner_text()
            assert "Observed by polling" in report and "hand-offs between two passes" in report
            assert "STALE_COMMIT_ACCEPTED" in report
            shot(page, "21-drill-mismatch-report")
            page.get_by_role("link", name=str(mismatch.pk), exact=True).click()
            page.get_by_label("Note (required to explain)").fill("legacy last-write-wins: the drill's A16")
            page.get_by_role("button", name="Mark explained").click()
            assert page.locator("#status").inner_text() == "EXPLAINED"

            gate_check.delay(NS).get()
            page.goto(f"{live_server.url}/ns/{NS}/")
            assert "mismatches await review" not in page.locator("body").inner_text()
            assert "V1_READS" in advance_in_ui(
                page, live_server, NS, "V1_READS"
            )  # the gate holds: on it goes
            assert stage_of(NS) == "V1_READS"
    finally:
        their.sql("DROP TABLE IF EXISTS jobs")
