"""The claim.v1 records: the core (namespaces, tasks, attempts, results, the timeline, principals), protected
resources, and the effect ledger. Only ``claims/services`` writes them."""

from __future__ import annotations

from .claim_keys import ClaimKey
from .core import (
    AcceptancePoint,
    Attempt,
    AttemptEnd,
    AuditEntry,
    EventKind,
    Namespace,
    Principal,
    ReplayPolicy,
    Role,
    StagedResult,
    Task,
    TaskDependency,
    TaskEvent,
    TaskState,
    Token,
)
from .effects import DispatchIntent, DispatchState, Effect, EffectEvent, EffectState
from .fair_share import FairnessKey, FairnessLane
from .metrics import JobRun, MetricFold, MetricTally, MinuteTally
from .resources import Resource, ResourceKey, TaskResource
from .serving import ServedHistory

__all__ = [
    "AcceptancePoint",
    "Attempt",
    "AttemptEnd",
    "AuditEntry",
    "ClaimKey",
    "FairnessKey",
    "FairnessLane",
    "DispatchIntent",
    "DispatchState",
    "Effect",
    "EffectEvent",
    "EffectState",
    "EventKind",
    "JobRun",
    "MetricFold",
    "MetricTally",
    "MinuteTally",
    "Namespace",
    "Principal",
    "ReplayPolicy",
    "Resource",
    "ResourceKey",
    "Role",
    "ServedHistory",
    "StagedResult",
    "Task",
    "TaskDependency",
    "TaskEvent",
    "TaskResource",
    "TaskState",
    "Token",
]
