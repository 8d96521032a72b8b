"""Entering SHADOW and rolling back, against the team's own table in its own database (issue 23, point 4): the
live claims imported from it (an expired one left to the takeover rule), and a rollback that hands the namespace
back to legacy writes claim.v1's state into the mapped columns first — what V1_ONLY never wrote there included. On a
second PostgreSQL database and on MariaDB; the records checked are both databases' rows."""

from __future__ import annotations

from datetime import timedelta

import pytest

from claims.models import AuditEntry, Task
from rollout.models import RolloutState
from tests.support.actors import make_actor
from tests.support.legacy_db import ALIASES, NS, aware, row, task_in_both

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", *ALIASES]),
    pytest.mark.skipif(
        not ALIASES, reason="no legacy database configured (the suite's PostgreSQL run adds one)"
    ),
]


def test_entering_shadow_imports_the_live_claims_of_their_table(table_store, operator, worker_a, worker_b):
    their = table_store
    oncall = make_actor("oscar-oncall", "oncall")
    assert operator.post("/namespaces", {"name": NS, "stage": "LEGACY"}).status_code == 201
    live, expired, free = (task_in_both(operator, their) for _ in range(3))
    their.sql(
        f"UPDATE jobs SET locked_by = 'worker-a', locked_until = {their.plus(60)} WHERE job_id = %s", [live]
    )
    their.sql(
        f"UPDATE jobs SET locked_by = 'worker-b', locked_until = {their.plus(-5)} WHERE job_id = %s",
        [expired],
    )

    moved = oncall.post(
        f"/namespaces/{NS}/rollout/advance", {"to_stage": "SHADOW", "reason": "drill", "override": True}
    )

    assert moved.status_code == 200, moved.json()
    held = Task.objects.get(pk=live)
    assert (held.state, held.owner_id) == ("CLAIMED", "worker-a")
    their_expiry = row(their, live)[1]
    assert abs(aware(held.lease_expires_at) - their_expiry) < timedelta(seconds=2)
    assert Task.objects.get(pk=expired).state == "READY"  # ran out: anyone may take it over
    assert Task.objects.get(pk=free).state == "READY"
    assert AuditEntry.objects.get(action="legacy_import").detail == {"imported": 1, "skipped": {}}


def test_a_rollback_from_v1_only_leaves_their_table_matching_claim_v1(table_store, operator, worker_a):
    their = table_store
    oncall = make_actor("oscar-oncall", "oncall")
    assert operator.post("/namespaces", {"name": NS, "stage": "V1_WRITES"}).status_code == 201
    written, unwritten, fenced = (task_in_both(operator, their) for _ in range(3))
    claim = worker_a.claim(written).json()
    assert worker_a.commit(claim, {"r": "written"}, inline=True).status_code == 200
    assert (
        oncall.post(
            f"/namespaces/{NS}/rollout/advance", {"to_stage": "V1_ONLY", "reason": "drill", "override": True}
        ).status_code
        == 200
    )
    claim = worker_a.claim(unwritten).json()
    assert worker_a.commit(claim, {"r": "v1 only"}, inline=True).status_code == 200
    assert worker_a.claim(fenced).status_code == 200
    assert row(their, unwritten)[2:4] == (None, None)  # V1_ONLY writes nothing there
    assert row(their, fenced)[0] is None

    rolled = oncall.post(
        f"/namespaces/{NS}/rollout/rollback", {"to_stage": "SHADOW", "reason": "drill", "force": True}
    )

    assert rolled.status_code == 200, rolled.json()
    assert RolloutState.objects.get(namespace__name=NS).stage == "SHADOW"
    assert row(their, written)[2:4] == ({"r": "written"}, "worker-a")
    assert row(their, unwritten)[2:4] == ({"r": "v1 only"}, "worker-a")  # written back
    assert row(their, fenced)[:2] in {("", None), (None, None)}  # fenced by the rollback: no owner
    assert Task.objects.get(pk=fenced).state == "CLAIMED"  # (claim.v1 still shows the fenced attempt)


def test_a_rollback_out_of_v1_writes_restores_every_mapped_column_and_lists_what_it_overwrote(
    their, operator, worker_a
):
    """Old binaries completed rows directly in V1_WRITES (flagged, reviewed): the rollback writes claim.v1's state
    over every column — owner, expiry, result, completion — so legacy's workers find the rows claim.v1 never
    committed; each overwritten completion is recorded first. Seen failing before: the completion columns stayed."""
    from rollout.models import WriteBackDifference
    from tests.support.legacy_db import their_table_configured

    their.sql("ALTER TABLE jobs ADD COLUMN row_version integer NOT NULL DEFAULT 0")
    with their_table_configured(their.alias, version="row_version"):
        oncall = make_actor("oscar-oncall", "oncall")
        assert operator.post("/namespaces", {"name": NS, "stage": "V1_WRITES"}).status_code == 201
        committed, direct, overwritten, free = (task_in_both(operator, their) for _ in range(4))
        for job, result in ((committed, {"r": "v1"}), (overwritten, {"r": "v1 too"})):
            claim = worker_a.claim(job).json()
            assert worker_a.commit(claim, result, inline=True).status_code == 200
        # old binaries, straight to the table: a completion claim.v1 never made, and one over claim.v1's result
        for job, by in ((direct, "old-1"), (overwritten, "old-2")):
            their.sql(
                "UPDATE jobs SET output = %s, finished_by = %s, locked_by = %s WHERE job_id = %s",
                ['{"r": "old"}', by, by, job],
            )
        versions = dict(their.sql("SELECT job_id, row_version FROM jobs"))

        rolled = oncall.post(
            f"/namespaces/{NS}/rollout/rollback", {"to_stage": "SHADOW", "reason": "drill", "force": True}
        )

        assert rolled.status_code == 200, rolled.json()
        for job in (committed, direct, overwritten, free):  # every mapped column as claim.v1 has it
            task = Task.objects.get(pk=job)
            owner, until, output, finished_by, _ = row(their, job)
            if task.state == "COMMITTED":
                assert (output, finished_by) == (task.result, task.owner_id), job
            else:
                assert (owner, until, output, finished_by) == (None, None, None, None), job
        assert Task.objects.get(pk=direct).state == "READY"
        after = dict(their.sql("SELECT job_id, row_version FROM jobs"))
        assert all(after[job] > versions[job] for job in (committed, direct, overwritten, free))
        listed = {d.task_id: (d.written, d.table["completed_by"]) for d in WriteBackDifference.objects.all()}
        assert listed == {direct: ("CLEARED", "old-1"), overwritten: ("REPLACED", "old-2")}
