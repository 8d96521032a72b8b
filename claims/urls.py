from __future__ import annotations

from django.urls import path

from . import apis

# Paths exactly as claim-v1.md writes them: no trailing slash.
urlpatterns = [
    path("tasks", apis.TaskListCreateApi.as_view(), name="tasks"),
    path("tasks/<str:task_id>", apis.TaskDetailApi.as_view(), name="task"),
    path("tasks/<str:task_id>/events", apis.TaskEventsApi.as_view(), name="task-events"),
    path("tasks/<str:task_id>/input", apis.TaskInputApi.as_view(), name="task-input"),
    path("tasks/<str:task_id>/cancel", apis.TaskCancelApi.as_view(), name="task-cancel"),
    path("tasks/<str:task_id>/requeue", apis.TaskRequeueApi.as_view(), name="task-requeue"),
    path("tasks/<str:task_id>/claim", apis.TaskClaimApi.as_view(), name="task-claim"),
    path("tasks/<str:task_id>/renew", apis.TaskRenewApi.as_view(), name="task-renew"),
    path("tasks/<str:task_id>/release", apis.TaskReleaseApi.as_view(), name="task-release"),
    path("tasks/<str:task_id>/results", apis.TaskResultsApi.as_view(), name="task-results"),
    path("tasks/<str:task_id>/commit", apis.TaskCommitApi.as_view(), name="task-commit"),
    path("claims", apis.ClaimNextApi.as_view(), name="claim-next"),
    path("namespaces", apis.NamespaceListCreateApi.as_view(), name="namespaces"),
    path("namespaces/<str:ns>", apis.NamespaceDetailApi.as_view(), name="namespace"),
    path("namespaces/<str:ns>/fence", apis.NamespaceFenceApi.as_view(), name="namespace-fence"),
    path("namespaces/<str:ns>/resume", apis.NamespaceResumeApi.as_view(), name="namespace-resume"),
]
