from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import JsonResponse
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from claims.metrics import metrics_view
from rollout.urls import legacy_urlpatterns, v1_urlpatterns


def not_found(request, exception=None):
    return JsonResponse({"outcome": "NOT_FOUND", "detail": "no such endpoint"}, status=404)


def server_error(request):
    return JsonResponse({"outcome": "ERROR", "detail": "internal error"}, status=500)


def bad_request(request, exception=None):
    return JsonResponse({"outcome": "INVALID", "errors": {"body": ["bad request"]}}, status=400)


handler400 = bad_request
handler404 = not_found
handler500 = server_error

urlpatterns = [
    path("", include("controlplane.console_urls")),
    path("login", auth_views.LoginView.as_view(), name="login"),
    path("logout", auth_views.LogoutView.as_view(), name="logout"),
    path("api/v1/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/v1/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    # rollout routes the claim.v1 worker operations by stage (it wraps the core); everything else is the core's.
    path("api/v1/", include(v1_urlpatterns)),
    path("api/v1/", include("claims.urls")),
    path("api/legacy/", include(legacy_urlpatterns)),
    path("admin/", admin.site.urls),
    path("metrics", metrics_view, name="metrics"),
]
