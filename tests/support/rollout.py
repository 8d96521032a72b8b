"""Test support for the rollout: a namespace's stage as the rollout records it, and its stage history replayed."""

from __future__ import annotations

from claims.models import Namespace
from rollout import selectors
from rollout.models import StageChange


def stage_of(namespace: str) -> str:
    return selectors.stage_of(Namespace.objects.select_related("rollout").get(name=namespace))


def stage_history_replays(namespace: str) -> list[str]:
    """The namespace's recorded stage changes replay as the documented moves only: each starts where the previous
    ended, and is one step forward or a rollback to an earlier stage; the last is where the namespace is."""
    changes = list(StageChange.objects.filter(namespace=namespace).order_by("at", "id"))
    stages = [changes[0].from_stage] if changes else []
    for change in changes:
        assert change.from_stage == stages[-1], [(c.from_stage, c.to_stage) for c in changes]
        step = selectors.ORDER.index(change.to_stage) - selectors.ORDER.index(change.from_stage)
        assert step == 1 or step < 0, (change.from_stage, change.to_stage)
        stages.append(change.to_stage)
    assert not stages or stage_of(namespace) == stages[-1]
    return stages
