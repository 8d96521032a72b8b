"""Every row of their table discovered (issue 34, points 3 and 4): entering SHADOW imports the table's rows as claim.v1
tasks in bulk — in the namespace the mapping's value map names, with their input, in batches with progress, resumable
— and a row their application inserts afterwards becomes a task on its own: on first sight in proxy mode (a request
naming it). No POST per row. The adapter's writes keep their conventions: a version column incremented, an updated-at
column set, a released owner NULL. On a second PostgreSQL database and on MariaDB; the records checked are both
databases' rows. (The change stream's first sight is in test_binlog.py and test_observe.py.)"""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from claims.models import Principal, Task, TaskEvent
from rollout.models import LegacyImport
from rollout.services import adoption
from tests.support.actors import make_actor
from tests.support.legacy_db import ALIASES, NS, task_in_both, their_table_configured

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True, databases=["default", *ALIASES]),
    pytest.mark.skipif(
        not ALIASES, reason="no legacy database configured (the suite's PostgreSQL run adds one)"
    ),
]
MAPPED = {"namespace_map": {"q-billing": NS}, "input": "payload"}


@pytest.fixture
def mapped(their):
    with their_table_configured(their.alias, **MAPPED):
        yield their


def _fill(their, count: int, queue: str = "q-billing", prefix: str = "r") -> list[str]:
    keys = [f"{prefix}{i:06d}" for i in range(count)]
    for start in range(0, count, 500):
        chunk = keys[start : start + 500]
        their.sql(
            "INSERT INTO jobs (job_id, queue, payload) VALUES " + ", ".join(["(%s, %s, %s)"] * len(chunk)),
            [v for key in chunk for v in (key, queue, json.dumps({"n": key}))],
        )
    return keys


def _to_shadow(operator):
    oncall = make_actor("oscar-oncall", "oncall")
    return oncall.post(
        f"/namespaces/{NS}/rollout/advance", {"to_stage": "SHADOW", "reason": "adopt", "override": True}
    )


def test_entering_shadow_imports_every_row_of_the_namespace_in_bulk(mapped, operator, worker_a, settings):
    their = mapped
    settings.LEGACY_IMPORT_BATCH = 1000
    assert operator.post("/namespaces", {"name": NS, "stage": "LEGACY"}).status_code == 201
    keys = _fill(their, 2500)
    _fill(their, 7, queue="unmapped", prefix="u")  # a value the map does not name: of no namespace
    their.sql(
        f"UPDATE jobs SET locked_by = 'worker-a', locked_until = {their.plus(60)} WHERE job_id = %s",
        [keys[10]],
    )
    existing = operator.create(namespace=NS, task_id=keys[5], input={"mine": True}).json()["task_id"]

    assert _to_shadow(operator).status_code == 200

    job = LegacyImport.objects.get()
    assert (job.status, job.total, job.read, job.created) == ("DONE", 2500, 2500, 2499)
    assert job.claims == {"imported": 1, "skipped": {}}
    tasks = Task.objects.filter(namespace__name=NS)
    assert sorted(tasks.values_list("task_id", flat=True)) == keys  # every mapped row, no unmapped one
    assert Task.objects.get(pk=keys[0]).input == {"n": keys[0]}  # their payload column is the input
    assert Task.objects.get(pk=existing).input == {"mine": True}  # a task claim.v1 had is left as it was
    assert (Task.objects.get(pk=keys[10]).state, Task.objects.get(pk=keys[10]).owner_id) == (
        "CLAIMED",
        "worker-a",
    )
    assert (
        TaskEvent.objects.filter(kind="task_created", task_id__in=keys).count() == 2500
    )  # one each, no repeat


def test_an_import_that_stopped_resumes_from_its_last_key_and_the_command_shows_progress(
    mapped, operator, settings, capsys
):
    their = mapped
    settings.LEGACY_IMPORT_BATCH = 400
    assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201
    keys = _fill(their, 1000)
    principal = Principal.objects.get(name=operator.name)
    job = adoption.start(namespace=NS, principal=principal)
    batches = 0

    def die(at: LegacyImport) -> None:
        nonlocal batches
        batches += 1
        if batches == 2:
            raise SystemExit("the import's process is killed after its second batch")

    with pytest.raises(SystemExit):
        adoption.run(job.pk, progress=die)
    assert Task.objects.filter(namespace__name=NS).count() == 800
    assert LegacyImport.objects.get(pk=job.pk).last_key == keys[799]

    call_command("legacy_import", NS, "--as", principal.name)

    out = capsys.readouterr().out
    assert "from key 'r000799'" in out  # resumed, not begun again
    assert "1000/1000 rows (100%)" in out and "done: 1000 rows read, 1000 tasks made" in out
    assert sorted(Task.objects.filter(namespace__name=NS).values_list("task_id", flat=True)) == keys
    assert LegacyImport.objects.get(pk=job.pk).status == "DONE"


def test_a_row_inserted_later_becomes_a_task_on_first_sight_in_proxy_mode(mapped, operator, worker_a):
    their = mapped
    assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201
    their.sql("INSERT INTO jobs (job_id, queue, payload) VALUES ('late-1', 'q-billing', '{\"late\": 1}')")
    their.sql("INSERT INTO jobs (job_id, queue, payload) VALUES ('late-2', 'unmapped', 'x')")

    answer = worker_a.client.post(
        "/api/legacy/tasks/late-1/claim", {"owner_id": "worker-a", "ttl_seconds": 30}, format="json"
    )
    stray = worker_a.client.post(
        "/api/legacy/tasks/late-2/claim", {"owner_id": "worker-a", "ttl_seconds": 30}, format="json"
    )

    assert answer.status_code == 200, answer.json()
    task = Task.objects.get(pk="late-1")
    assert (task.namespace.name, task.input, task.state, task.owner_id) == (
        NS,
        {"late": 1},
        "CLAIMED",
        "worker-a",
    )
    assert their.sql("SELECT locked_by FROM jobs WHERE job_id = 'late-1'")[0][0] == "worker-a"
    assert stray.status_code == 404 and not Task.objects.filter(pk="late-2").exists()  # of no namespace


def test_the_adapter_increments_their_version_sets_their_updated_at_and_releases_to_null(
    their, operator, worker_a
):
    their.sql("ALTER TABLE jobs ADD COLUMN row_version integer NOT NULL DEFAULT 0")
    their.sql(
        f"ALTER TABLE jobs ADD COLUMN touched_at {'datetime(6)' if their.mysql else 'timestamptz'} NULL"
    )
    with their_table_configured(their.alias, version="row_version", updated_at="touched_at"):
        assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201
        job = task_in_both(operator, their)
        claimed = worker_a.client.post(
            f"/api/legacy/tasks/{job}/claim", {"owner_id": "worker-a", "ttl_seconds": 30}, format="json"
        )
        assert claimed.status_code == 200, claimed.json()
        released = worker_a.client.post(
            f"/api/legacy/tasks/{job}/release", {"owner_id": "worker-a"}, format="json"
        )
        assert released.status_code == 200, released.json()

    owner, version, touched_at = their.sql(
        "SELECT locked_by, row_version, touched_at FROM jobs WHERE job_id = %s", [job]
    )[0]
    assert owner is None  # their pick query (locked_by IS NULL) finds it again
    assert version == 2  # their optimistic checks see both writes
    assert touched_at is not None


def test_where_legacys_record_is_the_answer_a_task_read_answers_from_their_table(
    table_store, operator, worker_a
):
    """Issue 34, point 7: in SHADOW the task read answers legacy's record — read from their table through the adapter,
    not from the emulated one (seen failing: READY while their table had it completed)."""
    their = table_store
    assert operator.post("/namespaces", {"name": NS, "stage": "SHADOW"}).status_code == 201
    done, held = task_in_both(operator, their), task_in_both(operator, their)
    their.sql(
        "UPDATE jobs SET output = %s, finished_by = 'their-w1' WHERE job_id = %s", ['{"by": "them"}', done]
    )
    their.sql(
        f"UPDATE jobs SET locked_by = 'their-w2', locked_until = {their.plus(60)} WHERE job_id = %s", [held]
    )

    first, second = (operator.get(f"/tasks/{task_id}").json() for task_id in (done, held))

    assert (first["read_from"], first["state"], first["owner_id"], first["result"]) == (
        "legacy",
        "COMMITTED",
        "their-w1",
        {"by": "them"},
    )
    assert (second["state"], second["owner_id"]) == ("CLAIMED", "their-w2")
    assert (
        Task.objects.get(pk=done).state == "READY"
    )  # claim.v1's own record is unchanged: a read writes nothing
