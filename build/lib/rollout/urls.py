"""The rollout's routes. ``worker_urlpatterns`` and ``namespace_urlpatterns`` take exactly the paths of the
core's lists of the same names (controlplane/urls.py mounts one or the other, never both)."""

from __future__ import annotations

from django.urls import path

from claims.urls import NameConverter, TaskIdConverter  # noqa: F401  (registers the converters)
from claims.waiting import offloaded, waiting

from . import legacy_apis, namespace_apis, rollout_apis, worker_apis

legacy_urlpatterns = [
    path("tasks/<task_id:task_id>/claim", legacy_apis.LegacyClaimApi.as_view(), name="legacy-claim"),
    path(
        "tasks/<task_id:task_id>/heartbeat", legacy_apis.LegacyHeartbeatApi.as_view(), name="legacy-heartbeat"
    ),
    path("tasks/<task_id:task_id>/release", legacy_apis.LegacyReleaseApi.as_view(), name="legacy-release"),
    path("tasks/<task_id:task_id>/complete", legacy_apis.LegacyCompleteApi.as_view(), name="legacy-complete"),
]

worker_urlpatterns = [
    path("tasks", worker_apis.TaskListCreateApi.as_view(), name="tasks"),
    path("tasks/<task_id:task_id>", worker_apis.TaskDetailApi.as_view(), name="task"),
    path("tasks/<task_id:task_id>/claim", offloaded(worker_apis.TaskClaimApi.as_view()), name="task-claim"),
    path("tasks/<task_id:task_id>/renew", offloaded(worker_apis.TaskRenewApi.as_view()), name="task-renew"),
    path(
        "tasks/<task_id:task_id>/release",
        offloaded(worker_apis.TaskReleaseApi.as_view()),
        name="task-release",
    ),
    path(
        "tasks/<task_id:task_id>/commit", offloaded(worker_apis.TaskCommitApi.as_view()), name="task-commit"
    ),
    # the worker endpoints are async views (claims/waiting.py): under ASGI they run in the shared executor, and a
    # claim with wait_seconds waits holding no thread
    path("claims", waiting(worker_apis.ClaimNextApi.as_view()), name="claim-next"),
    path("claims/batch", waiting(worker_apis.ClaimBatchApi.as_view()), name="claim-batch"),
    path("commits", offloaded(worker_apis.CommitsApi.as_view()), name="commits"),
]

namespace_urlpatterns = [
    path("namespaces", namespace_apis.NamespaceListCreateApi.as_view(), name="namespaces"),
    path("namespaces/<ns:ns>", namespace_apis.NamespaceDetailApi.as_view(), name="namespace"),
    path("namespaces/<ns:ns>/resume", namespace_apis.NamespaceResumeApi.as_view(), name="namespace-resume"),
]

rollout_urlpatterns = [
    path("namespaces/<ns:ns>/rollout", rollout_apis.RolloutApi.as_view(), name="rollout"),
    path("namespaces/<ns:ns>/rollout/advance", rollout_apis.AdvanceApi.as_view(), name="rollout-advance"),
    path("namespaces/<ns:ns>/rollout/rollback", rollout_apis.RollbackApi.as_view(), name="rollout-rollback"),
    path("namespaces/<ns:ns>/mismatches", rollout_apis.MismatchListApi.as_view(), name="mismatches"),
    path("namespaces/<ns:ns>/explain-rules", rollout_apis.ExplainRuleApi.as_view(), name="explain-rules"),
    path("namespaces/<ns:ns>/coverage", rollout_apis.CoverageApi.as_view(), name="coverage"),
    path("namespaces/<ns:ns>/coverage/waive", rollout_apis.WaiveApi.as_view(), name="coverage-waive"),
    path("namespaces/<ns:ns>/drain", rollout_apis.DrainApi.as_view(), name="drain"),
    path(
        "mismatches/<int:mismatch_id>/review",
        rollout_apis.MismatchReviewApi.as_view(),
        name="mismatch-review",
    ),
    path("pools", rollout_apis.PoolsApi.as_view(), name="pools"),
    path("workers/register", rollout_apis.RegisterApi.as_view(), name="worker-register"),
    path("workers/heartbeat", rollout_apis.HeartbeatApi.as_view(), name="worker-heartbeat"),
]
