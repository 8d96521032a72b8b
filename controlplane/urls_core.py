"""The control plane without the rollout (settings profile ``controlplane.settings.core``): the contract's
endpoints, the on-call tools (fence, audit, overview, pools, glance), the task and effect pages of the console,
/metrics. No rollout app, no legacy API. ``site`` is the frame both profiles share (controlplane/urls.py)."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import URLPattern, URLResolver, include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from claims import urls as core_urls
from claims.metrics import metrics_view
from gateway import urls as gateway_urls
from oncall import urls as oncall_urls

from . import handlers, health

handler400 = handlers.bad_request
handler404 = handlers.not_found
handler500 = handlers.server_error
handler403 = handlers.forbidden


def site(console: str, api_v1: list, *more: URLPattern | URLResolver) -> list[URLPattern | URLResolver]:
    """The site around a console (its URL module) and the API's routes: log-in, the schema and its docs, the
    admin, /metrics and the health checks — the same in every profile."""
    return [
        path("", include(console)),
        path("login", auth_views.LoginView.as_view(), name="login"),
        path("logout", auth_views.LogoutView.as_view(), name="logout"),
        path("api/v1/schema/", SpectacularAPIView.as_view(), name="schema"),
        path("api/v1/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
        path("api/v1/", include(api_v1)),
        *more,
        path("admin/", admin.site.urls),
        path("metrics", metrics_view, name="metrics"),
        path("favicon.ico", health.favicon),
        path("healthz", health.healthz, name="healthz"),
        path("readyz", health.readyz, name="readyz"),
    ]


urlpatterns = site(
    "controlplane.console_core_urls",
    core_urls.urlpatterns + oncall_urls.api_urlpatterns + gateway_urls.api_urlpatterns,
)
