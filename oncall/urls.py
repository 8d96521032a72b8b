"""The on-call tools' routes: ``api_urlpatterns`` under /api/v1/ and ``console_pages`` in the console (both URL
configurations mount them: the whole control plane, and the core without the rollout)."""

from __future__ import annotations

from django.urls import path

from claims.urls import NameConverter  # noqa: F401  (registers the converters)

from . import apis, views

api_urlpatterns = [
    path("namespaces/<ns:ns>/fence", apis.NamespaceFenceApi.as_view(), name="namespace-fence"),
    path("audit", apis.AuditApi.as_view(), name="audit"),
]

console_pages = [
    path("", views.overview, name="overview"),
    path("ns/<ns:ns>/incident", views.incident_page, name="incident"),
    path("ns/<ns:ns>/fence", views.fence, name="fence"),
    path("ns/<ns:ns>/resume", views.resume, name="resume"),
    path("pools/", views.pools, name="pools"),
    path("glance/", views.glance, name="glance"),
    path("jobs/", views.jobs, name="jobs"),
]
