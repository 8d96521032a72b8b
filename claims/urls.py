from __future__ import annotations

from types import ModuleType
from typing import Any

from django.urls import URLPattern, path, register_converter

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
    path("tasks/<task_id:task_id>/priority", apis.TaskPriorityApi.as_view(), name="task-priority"),
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

# The worker operations, the task reads and the namespace reads: each path, the name of the view class serving it,
# its URL name and how the view runs. The core serves them with its own views; a wrapping app (the rollout) serves
# exactly these paths with views of the same names instead — never both (controlplane/urls.py).
# The worker endpoints are async views (claims/waiting.py): under ASGI they run in the shared executor, and a claim
# with wait_seconds waits holding no thread.
_WORKER_ROUTES = (
    ("tasks", "TaskListCreateApi", "tasks", None),
    ("tasks/<task_id:task_id>", "TaskDetailApi", "task", None),
    ("tasks/<task_id:task_id>/claim", "TaskClaimApi", "task-claim", offloaded),
    ("tasks/<task_id:task_id>/renew", "TaskRenewApi", "task-renew", offloaded),
    ("tasks/<task_id:task_id>/release", "TaskReleaseApi", "task-release", offloaded),
    ("tasks/<task_id:task_id>/commit", "TaskCommitApi", "task-commit", offloaded),
    ("claims", "ClaimNextApi", "claim-next", waiting),
    ("claims/batch", "ClaimBatchApi", "claim-batch", waiting),
    ("commits", "CommitsApi", "commits", offloaded),
)
_NAMESPACE_ROUTES = (
    ("namespaces", "NamespaceListCreateApi", "namespaces", None),
    ("namespaces/<ns:ns>", "NamespaceDetailApi", "namespace", None),
    ("namespaces/<ns:ns>/resume", "NamespaceResumeApi", "namespace-resume", None),
)


def served_by(routes: tuple[tuple[str, str, str, Any], ...], *modules: ModuleType) -> list[URLPattern]:
    """``routes`` served by the view classes of those names, each found in the first of ``modules`` that has it."""
    patterns = []
    for route, view_name, name, runs in routes:
        view = next(getattr(m, view_name) for m in modules if hasattr(m, view_name)).as_view()
        patterns.append(path(route, runs(view) if runs else view, name=name))
    return patterns


def worker_urls(*modules: ModuleType) -> list[URLPattern]:
    return served_by(_WORKER_ROUTES, *modules)


def namespace_urls(*modules: ModuleType) -> list[URLPattern]:
    return served_by(_NAMESPACE_ROUTES, *modules)


worker_urlpatterns = worker_urls(apis, batch_apis)
namespace_urlpatterns = namespace_urls(namespace_apis)

urlpatterns = core_urlpatterns + worker_urlpatterns + namespace_urlpatterns
