"""Moving the rollout's state out of the core loses nothing: a database from before (stage and min_protocol on the
namespace, ``validated`` on the timeline) migrates to the rollout's own record and ``via`` — and the timeline is
append-only again afterwards."""

from __future__ import annotations

import pytest
from django.db import DatabaseError, connection, transaction
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("claims", "0010_namespace_pause_hold"), ("rollout", "0003_fence_request")]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def test_stage_protocol_and_validation_survive_the_move():
    old = _migrate(BEFORE)
    now = timezone.now()
    Namespace = old.get_model("claims", "Namespace")
    TaskEvent = old.get_model("claims", "TaskEvent")
    moving = Namespace.objects.create(
        name="moving", stage="SHADOW", min_protocol="claim.v1", created_at=now, updated_at=now
    )
    TaskEvent.objects.create(namespace=moving, kind="claimed", at=now, point="claim", validated=False)
    TaskEvent.objects.create(namespace=moving, kind="claimed", at=now, point="claim", validated=True)
    TaskEvent.objects.create(namespace=moving, kind="task_created", at=now)

    latest = _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

    RolloutState = latest.get_model("rollout", "RolloutState")
    TaskEvent = latest.get_model("claims", "TaskEvent")
    assert RolloutState.objects.get(namespace__name="moving").stage == "SHADOW"
    assert RolloutState.objects.get(namespace__name="moving").min_protocol == "claim.v1"
    assert sorted(TaskEvent.objects.values_list("kind", "point", "via")) == [
        ("claimed", "claim", ""),
        ("claimed", "claim", "legacy"),
        ("task_created", None, ""),
    ]
    with pytest.raises(DatabaseError), transaction.atomic():
        TaskEvent.objects.update(principal="someone-else")
