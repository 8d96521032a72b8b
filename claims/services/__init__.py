"""The only writers of claim.v1 records. One transaction per call; see each function's docstring."""

from __future__ import annotations

from . import claim_keys
from ._base import (
    Guard,
    NamespaceHold,
    acting_via,
    audit,
    enqueue,
    guarded,
    hold_namespace,
    namespace_lock,
    synthetic,
)
from ._sql import Statement, insert_statement, prep, write, writes_together
from .claiming import ClaimGrant, task_claim
from .commit_many import task_commit_many
from .committing import Committed, task_commit
from .dispatch_delivery import Delivery, dispatch_apply, dispatch_deliver, dispatch_heard, dispatch_lost
from .dispatch_intent import PreparedDispatch, effect_dispatch, effect_prepare_dispatch
from .effects import (
    Prepared,
    effect_approve,
    effect_prepare,
    effect_reconcile,
    effect_record_outcome,
)
from .leases import leases_reap, task_release, task_renew
from .namespaces import (
    epoch_fence,
    fence_reason,
    namespace_create,
    namespace_release_hold,
    namespace_resume,
)
from .picking import task_claim_batch, task_claim_next
from .principals import IssuedToken, hash_token, principal_ensure, token_issue, token_revoke
from .resources import ResourceView, resource_check, resource_create, resource_delete, resource_get
from .staging import Staged, result_stage
from .tasks import (
    TaskCreated,
    task_cancel,
    task_create,
    task_requeue,
    task_revise_input,
    task_set_priority,
    tasks_adopt,
)

__all__ = [
    "claim_keys",
    "Statement",
    "insert_statement",
    "prep",
    "write",
    "writes_together",
    "Guard",
    "NamespaceHold",
    "acting_via",
    "audit",
    "enqueue",
    "guarded",
    "Delivery",
    "Prepared",
    "ResourceView",
    "dispatch_apply",
    "dispatch_deliver",
    "dispatch_heard",
    "dispatch_lost",
    "effect_approve",
    "effect_dispatch",
    "effect_prepare_dispatch",
    "PreparedDispatch",
    "effect_prepare",
    "effect_reconcile",
    "effect_record_outcome",
    "resource_check",
    "resource_create",
    "resource_delete",
    "resource_get",
    "ClaimGrant",
    "Committed",
    "IssuedToken",
    "Staged",
    "TaskCreated",
    "epoch_fence",
    "fence_reason",
    "hash_token",
    "hold_namespace",
    "leases_reap",
    "namespace_create",
    "principal_ensure",
    "namespace_lock",
    "namespace_release_hold",
    "namespace_resume",
    "result_stage",
    "task_cancel",
    "task_claim",
    "task_claim_batch",
    "task_claim_next",
    "task_commit",
    "task_commit_many",
    "task_create",
    "tasks_adopt",
    "task_release",
    "task_renew",
    "task_requeue",
    "task_revise_input",
    "task_set_priority",
    "token_issue",
    "token_revoke",
    "synthetic",
]
