"""The operator console's URLs (server-rendered pages; the API lives under /api/): the core's task and effect
pages, the on-call pages, and the rollout's."""

from __future__ import annotations

from django.urls import path

from oncall.urls import console_pages as oncall_pages
from rollout import views

from .console_core_urls import core_pages

app_name = "console"

urlpatterns = [
    *oncall_pages,
    path("ns/<ns:ns>/", views.rollout_page, name="rollout"),
    path("ns/<ns:ns>/advance", views.advance, name="advance"),
    path("ns/<ns:ns>/rollback", views.rollback, name="rollback"),
    path("ns/<ns:ns>/waive", views.waive, name="waive"),
    path("ns/<ns:ns>/mismatches", views.mismatches, name="mismatches"),
    path("ns/<ns:ns>/mismatches/review", views.mismatches_review, name="mismatches-review"),
    path("mismatches/<int:mismatch_id>", views.mismatch_detail, name="mismatch"),
    path("mismatches/<int:mismatch_id>/mark", views.mismatch_mark, name="mismatch-mark"),
    *core_pages,
]
