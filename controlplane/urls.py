from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from claims import urls as core_urls
from claims.metrics import metrics_view
from gateway import urls as gateway_urls
from oncall import urls as oncall_urls
from rollout import urls as rollout_urls

from . import handlers, health

handler400 = handlers.bad_request
handler404 = handlers.not_found
handler500 = handlers.server_error
handler403 = handlers.forbidden

# The whole control plane: the core's own endpoints, the on-call tools', and the rollout wrapping the core — its views serve the
# worker operations, task reads and namespace reads (routed by stage), in place of the core's views for those
# paths, which are not mounted here. Without the rollout: controlplane/urls_core.py.
api_v1 = (
    core_urls.core_urlpatterns
    + oncall_urls.api_urlpatterns
    + gateway_urls.api_urlpatterns
    + rollout_urls.worker_urlpatterns
    + rollout_urls.namespace_urlpatterns
    + rollout_urls.rollout_urlpatterns
)

urlpatterns = [
    path("", include("controlplane.console_urls")),
    path("login", auth_views.LoginView.as_view(), name="login"),
    path("logout", auth_views.LogoutView.as_view(), name="logout"),
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/v1/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/v1/", include(api_v1)),
    path("api/legacy/", include(rollout_urls.legacy_urlpatterns)),
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
    path("favicon.ico", health.favicon),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
]
