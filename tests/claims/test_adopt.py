"""tasks_adopt (issue 34): tasks made in bulk from another system's records — one INSERT … ON CONFLICT DO NOTHING, an
existing task left as it is, one task_created per task it made — on SQLite and PostgreSQL alike."""

from __future__ import annotations

import pytest

from claims import services
from claims.errors import Invalid
from claims.models import Task, TaskEvent

pytestmark = pytest.mark.django_db(transaction=True)


def test_adopt_makes_each_missing_task_once_and_leaves_existing_ones(default_namespace):
    who = services.principal_ensure(name="importer", role="operator")

    made = services.tasks_adopt(
        principal=who, namespace="default", node_id="legacy", tasks=[("a", {"x": 1}), ("b", None)]
    )
    again = services.tasks_adopt(
        principal=who, namespace="default", node_id="legacy", tasks=[("a", {"x": 2}), ("c", "t")]
    )

    assert sorted(made) == ["a", "b"] and again == ["c"]
    assert Task.objects.get(pk="a").input == {"x": 1}  # not rewritten
    assert Task.objects.get(pk="b").input == {}  # a NULL column: never a null input
    assert set(Task.objects.values_list("state", flat=True)) == {"READY"}
    assert TaskEvent.objects.filter(kind="task_created").count() == 3
    with pytest.raises(Invalid):
        services.tasks_adopt(principal=who, namespace="nowhere", node_id="legacy", tasks=[("d", {})])
    assert not Task.objects.filter(pk="d").exists()
