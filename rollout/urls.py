"""The rollout's routes. ``worker_urlpatterns`` and ``namespace_urlpatterns`` are the core's paths (one table in
claims/urls.py) served by the rollout's views of the same names (controlplane/urls.py mounts one or the other,
never both)."""

from __future__ import annotations

from django.urls import path

from claims.urls import namespace_urls, worker_urls  # (importing claims.urls registers the converters)

from . import legacy_apis, namespace_apis, rollout_apis, views, worker_apis

# The rollout's console pages (controlplane/console_urls.py mounts them beside the core's and the on-call tools').
console_pages = [
    path("ns/<ns:ns>/", views.rollout_page, name="rollout"),
    path("ns/<ns:ns>/advance", views.advance, name="advance"),
    path("ns/<ns:ns>/rollback", views.rollback, name="rollback"),
    path("ns/<ns:ns>/waive", views.waive, name="waive"),
    path("ns/<ns:ns>/mismatches", views.mismatches, name="mismatches"),
    path("ns/<ns:ns>/mismatches/review", views.mismatches_review, name="mismatches-review"),
    path("mismatches/<int:mismatch_id>", views.mismatch_detail, name="mismatch"),
    path("mismatches/<int:mismatch_id>/mark", views.mismatch_mark, name="mismatch-mark"),
]

legacy_urlpatterns = [
    path("tasks/<task_id:task_id>/claim", legacy_apis.LegacyClaimApi.as_view(), name="legacy-claim"),
    path(
        "tasks/<task_id:task_id>/heartbeat", legacy_apis.LegacyHeartbeatApi.as_view(), name="legacy-heartbeat"
    ),
    path("tasks/<task_id:task_id>/release", legacy_apis.LegacyReleaseApi.as_view(), name="legacy-release"),
    path("tasks/<task_id:task_id>/complete", legacy_apis.LegacyCompleteApi.as_view(), name="legacy-complete"),
]

worker_urlpatterns = worker_urls(worker_apis)
namespace_urlpatterns = namespace_urls(namespace_apis)

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
