"""The whole control plane: the core's own endpoints, the on-call tools', the gateway's, and the rollout wrapping the
core — its views serve the worker operations, task reads and namespace reads (routed by stage), in place of the
core's views for those paths, which are not mounted here — and the legacy API. Without the rollout:
controlplane/urls_core.py, whose frame (``site``) and error handlers this profile shares."""

from __future__ import annotations

from django.urls import include, path

from claims import urls as core_urls
from gateway import urls as gateway_urls
from oncall import urls as oncall_urls
from rollout import urls as rollout_urls

from .urls_core import handler400, handler403, handler404, handler500, site

__all__ = ["handler400", "handler403", "handler404", "handler500", "urlpatterns"]

api_v1 = (
    core_urls.core_urlpatterns
    + oncall_urls.api_urlpatterns
    + gateway_urls.api_urlpatterns
    + rollout_urls.worker_urlpatterns
    + rollout_urls.namespace_urlpatterns
    + rollout_urls.rollout_urlpatterns
)

urlpatterns = site(
    "controlplane.console_urls", api_v1, path("api/legacy/", include(rollout_urls.legacy_urlpatterns))
)
