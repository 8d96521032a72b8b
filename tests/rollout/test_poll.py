"""Observe mode on MariaDB (issue 23, point 2): the polling observer. The team's workers write their own table by
plain SQL; each pass reads the rows whose ``changed_at`` moved, compares each with its copy of the row, and judges the
decision the difference was with claim.v1 in shadow. The stale overwrite (A16) is caught when the passes see each
write; the documented limit — hand-offs between two passes are not seen — is shown as it is."""

from __future__ import annotations

import time

import pytest
from django.db import connections

from rollout.models import ComparedOperation, LegacyEvent, Mismatch, ObservedRow, ObserverPosition
from rollout.services import poll
from tests.support.legacy_db import (
    NS,
    Their,
    mysql_claim,
    mysql_complete,
    mysql_release,
    task_in_both,
    their_table_configured,
)

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", "legacy_mysql"]),
    pytest.mark.skipif(
        "legacy_mysql" not in connections, reason="no MariaDB (LEGACY_MYSQL_URL; .ci/run sets it)"
    ),
]


@pytest.fixture
def their(settings):
    db = Their("legacy_mysql")
    db.create_jobs()
    db.sql(
        "ALTER TABLE jobs ADD COLUMN changed_at datetime(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6) "
        "ON UPDATE CURRENT_TIMESTAMP(6)"
    )
    db.sql("CREATE INDEX jobs_changed_at ON jobs (changed_at)")
    settings.LEGACY_POLL_MARGIN_SECONDS = 0
    with their_table_configured("legacy_mysql", changed="changed_at"):
        yield db
    db.sql("DROP TABLE IF EXISTS jobs")


claim, release, complete = mysql_claim, mysql_release, mysql_complete


def test_a_pass_after_each_write_catches_the_stale_overwrite(their, operator):
    assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201
    job = task_in_both(operator, their)
    poll.setup()
    assert ObservedRow.objects.filter(pk=job).exists()  # the table as it was, copied; nothing judged

    assert claim(their, job, "w1", ttl=1)
    assert poll.poll_once()["judged"] == 1
    time.sleep(1.2)
    assert claim(their, job, "w2", ttl=30)
    assert poll.poll_once()["judged"] == 1
    complete(their, job, "w1", {"by": "w1"})
    assert poll.poll_once()["judged"] == 1
    complete(their, job, "w2", {"by": "w2"})
    assert poll.poll_once()["judged"] == 1
    assert {k: v for k, v in poll.poll_once().items() if k != "oldest"} == {
        "rows": 0,
        "judged": 0,
        "unknown": 0,
        "direct": 0,
        "more": 0,
    }

    events = list(LegacyEvent.objects.filter(task_id=job).order_by("id").values_list("operation", "owner_id"))
    assert events == [("claim", "w1"), ("claim", "w2"), ("complete", "w1"), ("complete", "w2")]
    reasons = list(Mismatch.objects.filter(task_id=job).values_list("reason", "operation"))
    assert reasons == [("STALE_COMMIT_ACCEPTED", "complete")]
    assert ObserverPosition.objects.get().judged == 4


def test_hand_offs_between_two_passes_are_not_seen(their, operator):
    """The limit the docs and the report state: w1 claims and releases, w2 claims, all between two passes — one
    difference (free → w2) is judged; w1's claim and release never are."""
    assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201
    job = task_in_both(operator, their)
    poll.setup()
    assert claim(their, job, "w1", ttl=30)
    release(their, job, "w1")
    assert claim(their, job, "w2", ttl=30)

    assert poll.poll_once()["judged"] == 1

    assert list(LegacyEvent.objects.values_list("operation", "owner_id")) == [("claim", "w2")]
    assert ComparedOperation.objects.filter(namespace=NS).count() == 1


def test_the_shadow_report_says_the_table_is_polled_and_what_that_misses(
    their, operator, client, django_user_model
):
    from django.contrib.auth.models import Group
    from django.urls import reverse

    poll.setup()
    user = django_user_model.objects.create_user("rita-reviewer", password="pw")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    client.force_login(user)
    assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201

    page = client.get(reverse("console:mismatches", args=[NS]))

    assert page.status_code == 200
    assert b"hand-offs between two passes" in page.content


def test_a_claim_and_its_complete_between_two_passes_are_judged_as_two(their, operator):
    """A worker of theirs claims and completes a job between two passes: the difference (free → owned and completed
    by it) is the claim, then the complete — both agree with claim.v1 (judged as a complete alone, claim.v1 would
    have had no attempt of that worker to commit: a STALE_COMMIT_ACCEPTED that never happened)."""
    assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201
    job = task_in_both(operator, their)
    poll.setup()
    assert claim(their, job, "w1", ttl=30)
    complete(their, job, "w1", {"by": "w1"})

    assert poll.poll_once()["judged"] == 1

    assert list(LegacyEvent.objects.order_by("id").values_list("operation", "owner_id")) == [
        ("claim", "w1"),
        ("complete", "w1"),
    ]
    assert not Mismatch.objects.exists()
    assert ComparedOperation.objects.filter(namespace=NS, agreed=True).count() == 2
