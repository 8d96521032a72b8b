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
