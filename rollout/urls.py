from __future__ import annotations

from django.urls import path

from claims.urls import TaskIdConverter  # noqa: F401  (registers the task_id converter)

from . import apis

legacy_urlpatterns = [
    path("tasks/<task_id:task_id>/claim", apis.LegacyClaimApi.as_view(), name="legacy-claim"),
    path("tasks/<task_id:task_id>/heartbeat", apis.LegacyHeartbeatApi.as_view(), name="legacy-heartbeat"),
    path("tasks/<task_id:task_id>/release", apis.LegacyReleaseApi.as_view(), name="legacy-release"),
    path("tasks/<task_id:task_id>/complete", apis.LegacyCompleteApi.as_view(), name="legacy-complete"),
]

# The claim.v1 worker operations, routed by stage; mounted before the core's own routes for the same paths.
v1_urlpatterns = [
    path("tasks/<task_id:task_id>/claim", apis.RoutedClaimApi.as_view(), name="routed-task-claim"),
    path("tasks/<task_id:task_id>/renew", apis.RoutedRenewApi.as_view(), name="routed-task-renew"),
    path("tasks/<task_id:task_id>/release", apis.RoutedReleaseApi.as_view(), name="routed-task-release"),
    path("tasks/<task_id:task_id>/commit", apis.RoutedCommitApi.as_view(), name="routed-task-commit"),
]
