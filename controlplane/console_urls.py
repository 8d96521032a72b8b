"""The operator console's URLs (server-rendered pages; the API lives under /api/): the core's task and effect
pages, and the rollout's."""

from __future__ import annotations

from django.urls import path

from rollout import views

from .console_core_urls import core_pages

app_name = "console"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("ns/<ns:ns>/", views.rollout_page, name="rollout"),
    path("ns/<ns:ns>/advance", views.advance, name="advance"),
    path("ns/<ns:ns>/rollback", views.rollback, name="rollback"),
    path("ns/<ns:ns>/fence", views.fence, name="fence"),
    path("ns/<ns:ns>/resume", views.resume, name="resume"),
    path("ns/<ns:ns>/waive", views.waive, name="waive"),
    path("ns/<ns:ns>/mismatches", views.mismatches, name="mismatches"),
    path("ns/<ns:ns>/mismatches/review", views.mismatches_review, name="mismatches-review"),
    path("mismatches/<int:mismatch_id>", views.mismatch_detail, name="mismatch"),
    path("mismatches/<int:mismatch_id>/mark", views.mismatch_mark, name="mismatch-mark"),
    *core_pages,
    path("pools/", views.pools, name="pools"),
    path("glance/", views.glance, name="glance"),
]
