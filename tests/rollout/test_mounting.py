"""Routing is mounted once: with the rollout app, every path is served by exactly one view — the rollout's for the
worker operations, task reads and namespace reads, the core's for the rest — and the schema documents each
operation once. Without it (controlplane.urls_core) the core's views serve the same paths."""

from __future__ import annotations

from collections import Counter

from django.urls import URLPattern, URLResolver, get_resolver, resolve

from rollout import namespace_apis, worker_apis

ROUTED = {
    "/api/v1/tasks": worker_apis.TaskListCreateApi,
    "/api/v1/tasks/t-1": worker_apis.TaskDetailApi,
    "/api/v1/tasks/t-1/claim": worker_apis.TaskClaimApi,
    "/api/v1/tasks/t-1/renew": worker_apis.TaskRenewApi,
    "/api/v1/tasks/t-1/release": worker_apis.TaskReleaseApi,
    "/api/v1/tasks/t-1/commit": worker_apis.TaskCommitApi,
    "/api/v1/claims": worker_apis.ClaimNextApi,
    "/api/v1/namespaces": namespace_apis.NamespaceListCreateApi,
    "/api/v1/namespaces/default": namespace_apis.NamespaceDetailApi,
    "/api/v1/namespaces/default/resume": namespace_apis.NamespaceResumeApi,
}


def _routes(patterns, prefix: str = "") -> list[str]:
    out = []
    for entry in patterns:
        if isinstance(entry, URLResolver):
            out += _routes(entry.url_patterns, prefix + str(entry.pattern))
        elif isinstance(entry, URLPattern):
            out.append(prefix + str(entry.pattern))
    return out


def test_every_path_is_mounted_once():
    counts = Counter(_routes(get_resolver("controlplane.urls").url_patterns))

    assert [route for route, n in counts.items() if n > 1] == []


def test_the_worker_operations_resolve_to_the_rollouts_views_and_without_it_to_the_cores():
    for path, view in ROUTED.items():
        assert resolve(path, "controlplane.urls").func.view_class is view, path
        core = resolve(path, "controlplane.urls_core").func.view_class
        assert core.__module__ in ("claims.apis", "claims.namespace_apis", "claims.batch_apis"), (path, core)


def test_the_schema_documents_each_operation_once(operator):
    schema = operator.client.get("/api/v1/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    operations = Counter(op["operationId"] for item in schema["paths"].values() for op in item.values())

    assert [op for op, n in operations.items() if n > 1] == []
    assert "task_commit" in operations and "rollout_advance" in operations
