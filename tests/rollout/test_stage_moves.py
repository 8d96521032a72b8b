"""Every stage move is in the audit log, and a second rollback says what it did (issue 24): an advance (forward), an
oncall override and a rollback — finished by a request or by the advance_rollback job — each write one
``namespace_set_stage`` entry with the principal and the kind of move; a rollback asked for while one is open and
still draining answers 409 ROLLBACK_IN_PROGRESS and changes nothing (it answered as if it had started)."""

from __future__ import annotations

from claims.models import AuditEntry, Namespace
from rollout.models import Rollback
from rollout.tasks import advance_rollback
from tests.console.test_pages import login
from tests.support.actors import make_actor
from tests.support.rollout import stage_of


def _moves(ns: str) -> list[tuple[str, str, str, str]]:
    return [
        (e.principal, e.detail["from"], e.detail["to"], e.detail["move"])
        for e in AuditEntry.objects.filter(namespace=ns, action="namespace_set_stage").order_by("id")
    ]


def _draining(operator, oncall, ns: str, stage: str = "SHADOW") -> Rollback:
    """A rollback to LEGACY held open by a legacy-API lease that has not run out."""
    assert operator.post("/namespaces", {"name": ns, "stage": stage}).status_code == 201
    task_id = operator.create(namespace=ns).json()["task_id"]
    legacy = make_actor(f"{ns}-legacy", "worker", "legacy")
    legacy.client.post(
        f"/api/legacy/tasks/{task_id}/claim", {"owner_id": legacy.name, "ttl_seconds": 300}, format="json"
    )
    started = oncall.post(
        f"/namespaces/{ns}/rollout/rollback", {"to_stage": "LEGACY", "reason": "bad shadow"}
    )
    assert started.status_code == 202, started.content
    return Rollback.objects.get(namespace=ns)


def test_forward_override_and_a_rollback_finished_by_its_job_are_each_audited(operator, oncall, settings):
    settings.ROLLOUT_MIN_SAMPLES = 10**6  # the SHADOW gate stays shut: only an override passes it
    assert operator.post("/namespaces", {"name": "moves", "stage": "LEGACY"}).status_code == 201
    v1 = make_actor("moves-v1", "worker", "v1")
    registered = v1.post(
        "/workers/register", {"protocol": "claim.v1", "binary_version": "2.0", "namespace": "moves"}
    )
    assert registered.status_code == 201, registered.content
    forward = operator.post("/namespaces/moves/rollout/advance", {"to_stage": "SHADOW", "reason": "pilot"})
    assert forward.status_code == 200, forward.content
    assert (
        oncall.post(
            "/namespaces/moves/rollout/advance",
            {"to_stage": "V1_READS", "reason": "on call says so", "override": True},
        ).json()["stage"]
        == "V1_READS"
    )
    rolled = oncall.post("/namespaces/moves/rollout/rollback", {"to_stage": "SHADOW", "reason": "incident 9"})
    assert rolled.status_code == 200, rolled.content  # nothing to drain: done in the request

    assert stage_of("moves") == "SHADOW"
    assert _moves("moves") == [
        ("olivia-operator", "LEGACY", "SHADOW", "forward"),
        ("oscar-oncall", "SHADOW", "V1_READS", "override"),
        ("oscar-oncall", "V1_READS", "SHADOW", "rollback"),
    ]
    assert AuditEntry.objects.filter(
        namespace="moves", action="rollback_start", principal="oscar-oncall"
    ).exists()


def test_a_rollback_the_job_finishes_is_audited_with_the_principal_who_asked(operator, oncall, db_clock):
    rollback = _draining(operator, oncall, "drained-by-job")
    assert _moves("drained-by-job") == []
    db_clock.travel(301)  # the legacy lease runs out

    advance_rollback(rollback.pk)

    assert stage_of("drained-by-job") == "LEGACY"
    assert _moves("drained-by-job") == [("oscar-oncall", "SHADOW", "LEGACY", "rollback")]


def test_a_second_rollback_while_one_drains_is_refused_and_changes_nothing(operator, oncall):
    rollback = _draining(operator, oncall, "twice")
    epoch = Namespace.objects.get(name="twice").scheduler_epoch

    again = oncall.post("/namespaces/twice/rollout/rollback", {"to_stage": "LEGACY", "reason": "again"})
    elsewhere = oncall.post("/namespaces/twice/rollout/rollback", {"to_stage": "LEGACY", "reason": "x"})
    page = login("oncall").post(
        "/ns/twice/rollback", {"to_stage": "LEGACY", "reason": "from the console"}, follow=True
    )

    for answer in (again, elsewhere):
        assert answer.status_code == 409 and answer.json()["outcome"] == "ROLLBACK_IN_PROGRESS"
        assert answer.json()["current"]["rollback"]["step"] == "DRAINING"
    assert b"ROLLBACK_IN_PROGRESS" in page.content and b"Rollback started" not in page.content
    assert Rollback.objects.filter(namespace="twice").count() == 1
    assert Rollback.objects.get(pk=rollback.pk).finished_at is None
    assert Namespace.objects.get(name="twice").scheduler_epoch == epoch  # no second fence
    assert stage_of("twice") == "SHADOW"

    forced = oncall.post(
        "/namespaces/twice/rollout/rollback", {"to_stage": "LEGACY", "reason": "finish it", "force": True}
    )
    assert forced.status_code == 200 and forced.json()["outcome"] == "ROLLED_BACK"
    assert stage_of("twice") == "LEGACY"


def test_a_rollback_naming_another_stage_while_one_is_open_is_refused(operator, oncall):
    _draining(operator, oncall, "other", stage="V1_READS")

    other = oncall.post(
        "/namespaces/other/rollout/rollback", {"to_stage": "SHADOW", "reason": "x", "force": True}
    )

    assert other.status_code == 409 and other.json()["current"]["rollback"]["to_stage"] == "LEGACY"
    assert stage_of("other") == "V1_READS"
