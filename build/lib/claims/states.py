"""The task state machine: one table of allowed transitions, checked on the source *and* the target."""

from __future__ import annotations

from .errors import InvalidTransition
from .models import TaskState

S = TaskState

TASK_TRANSITIONS: dict[tuple[str, str], str] = {
    (S.BLOCKED, S.READY): "unblock",  # the last predecessor's canonical commit
    (S.READY, S.CLAIMED): "claim",
    (S.CLAIMED, S.CLAIMED): "reclaim",  # lease expired, or granted under an older epoch
    (S.CLAIMED, S.READY): "release",
    (S.CLAIMED, S.COMMITTED): "commit",
    (S.BLOCKED, S.CANCELLED): "cancel",
    (S.READY, S.CANCELLED): "cancel",
    (S.CLAIMED, S.CANCELLED): "cancel",
    (S.CANCELLED, S.READY): "requeue",
    (S.CANCELLED, S.BLOCKED): "requeue",
}


def check_transition(source: str, target: str, action: str) -> None:
    if TASK_TRANSITIONS.get((source, target)) != action:
        raise InvalidTransition(
            f"{action} may not move a task from {source} to {target}",
            current={"state": source},
        )
