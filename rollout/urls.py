from __future__ import annotations

from django.urls import path

from claims.urls import NameConverter, TaskIdConverter  # noqa: F401  (registers the converters)

from . import apis, rollout_apis, routed_apis

legacy_urlpatterns = [
    path("tasks/<task_id:task_id>/claim", apis.LegacyClaimApi.as_view(), name="legacy-claim"),
    path("tasks/<task_id:task_id>/heartbeat", apis.LegacyHeartbeatApi.as_view(), name="legacy-heartbeat"),
    path("tasks/<task_id:task_id>/release", apis.LegacyReleaseApi.as_view(), name="legacy-release"),
    path("tasks/<task_id:task_id>/complete", apis.LegacyCompleteApi.as_view(), name="legacy-complete"),
]

# The claim.v1 worker operations, routed by stage; mounted before the core's own routes for the same paths.
v1_urlpatterns = [
    path("tasks", routed_apis.RoutedTaskListApi.as_view(), name="routed-tasks"),
    path("claims", routed_apis.RoutedClaimNextApi.as_view(), name="routed-claim-next"),
    path("tasks/<task_id:task_id>", routed_apis.RoutedTaskDetailApi.as_view(), name="routed-task"),
    path("tasks/<task_id:task_id>/claim", routed_apis.RoutedClaimApi.as_view(), name="routed-task-claim"),
    path("tasks/<task_id:task_id>/renew", routed_apis.RoutedRenewApi.as_view(), name="routed-task-renew"),
    path(
        "tasks/<task_id:task_id>/release", routed_apis.RoutedReleaseApi.as_view(), name="routed-task-release"
    ),
    path("tasks/<task_id:task_id>/commit", routed_apis.RoutedCommitApi.as_view(), name="routed-task-commit"),
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
    path("audit", rollout_apis.AuditApi.as_view(), name="audit"),
    path("workers/register", rollout_apis.RegisterApi.as_view(), name="worker-register"),
    path("workers/heartbeat", rollout_apis.HeartbeatApi.as_view(), name="worker-heartbeat"),
]
