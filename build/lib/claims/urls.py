from __future__ import annotations

from django.urls import path, register_converter

from . import apis, batch_apis, effect_apis, namespace_apis
from .waiting import offloaded, waiting


class TaskIdConverter:
    """Task ids as task_create accepts them; anything else in the path is a 404 before any query runs."""

    regex = r"[A-Za-z0-9][A-Za-z0-9._:@+=~-]{0,199}"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


class NameConverter(TaskIdConverter):
    regex = r"[-a-zA-Z0-9_]{1,100}"


register_converter(TaskIdConverter, "task_id")
register_converter(NameConverter, "ns")


class EffectIdConverter(TaskIdConverter):
    regex = r"[0-9a-f]{64}"


register_converter(EffectIdConverter, "effect_id")

# Paths exactly as claim-v1.md writes them: no trailing slash.

# Served by the core whatever else is installed.
core_urlpatterns = [
    path("tasks/<task_id:task_id>/events", apis.TaskEventsApi.as_view(), name="task-events"),
    path("tasks/<task_id:task_id>/input", apis.TaskInputApi.as_view(), name="task-input"),
    path("tasks/<task_id:task_id>/cancel", apis.TaskCancelApi.as_view(), name="task-cancel"),
    path("tasks/<task_id:task_id>/requeue", apis.TaskRequeueApi.as_view(), name="task-requeue"),
    path("tasks/<task_id:task_id>/results", offloaded(apis.TaskResultsApi.as_view()), name="task-results"),
    path("effects/prepare", effect_apis.EffectPrepareApi.as_view(), name="effect-prepare"),
    path("effects/<effect_id:effect_id>", effect_apis.EffectDetailApi.as_view(), name="effect"),
    path(
        "effects/<effect_id:effect_id>/approve", effect_apis.EffectApproveApi.as_view(), name="effect-approve"
    ),
    path(
        "effects/<effect_id:effect_id>/outcome", effect_apis.EffectOutcomeApi.as_view(), name="effect-outcome"
    ),
    path(
        "effects/<effect_id:effect_id>/reconcile",
        effect_apis.EffectReconcileApi.as_view(),
        name="effect-reconcile",
    ),
    path(
        "effects/<effect_id:effect_id>/dispatch",
        effect_apis.EffectDispatchApi.as_view(),
        name="effect-dispatch",
    ),
    path("resources", effect_apis.ResourceCreateApi.as_view(), name="resources"),
    path("resources/<task_id:key>", effect_apis.ResourceDetailApi.as_view(), name="resource"),
    path("resources/<task_id:key>/check", effect_apis.ResourceCheckApi.as_view(), name="resource-check"),
]

# The worker operations, the task reads and the namespace reads as the core alone serves them. A wrapping app
# (the rollout) mounts its own views for exactly these paths instead — never both (controlplane/urls.py).
worker_urlpatterns = [
    path("tasks", apis.TaskListCreateApi.as_view(), name="tasks"),
    path("tasks/<task_id:task_id>", apis.TaskDetailApi.as_view(), name="task"),
    path("tasks/<task_id:task_id>/claim", offloaded(apis.TaskClaimApi.as_view()), name="task-claim"),
    path("tasks/<task_id:task_id>/renew", offloaded(apis.TaskRenewApi.as_view()), name="task-renew"),
    path("tasks/<task_id:task_id>/release", offloaded(apis.TaskReleaseApi.as_view()), name="task-release"),
    path("tasks/<task_id:task_id>/commit", offloaded(apis.TaskCommitApi.as_view()), name="task-commit"),
    # the worker endpoints are async views (claims/waiting.py): under ASGI they run in the shared executor, and a
    # claim with wait_seconds waits holding no thread
    path("claims", waiting(apis.ClaimNextApi.as_view()), name="claim-next"),
    path("claims/batch", waiting(batch_apis.ClaimBatchApi.as_view()), name="claim-batch"),
    path("commits", offloaded(batch_apis.CommitsApi.as_view()), name="commits"),
]
namespace_urlpatterns = [
    path("namespaces", namespace_apis.NamespaceListCreateApi.as_view(), name="namespaces"),
    path("namespaces/<ns:ns>", namespace_apis.NamespaceDetailApi.as_view(), name="namespace"),
    path("namespaces/<ns:ns>/resume", namespace_apis.NamespaceResumeApi.as_view(), name="namespace-resume"),
]

urlpatterns = core_urlpatterns + worker_urlpatterns + namespace_urlpatterns
