"""The operator console's URLs (server-rendered pages; the API lives under /api/)."""

from __future__ import annotations

from django.urls import path

from claims import views as claim_views
from claims.urls import EffectIdConverter, NameConverter, TaskIdConverter  # noqa: F401  (registers converters)
from rollout import views

app_name = "console"

urlpatterns = [
    path("", views.overview, name="overview"),
    path("ns/<ns:ns>/", views.rollout_page, name="rollout"),
    path("ns/<ns:ns>/advance", views.advance, name="advance"),
    path("ns/<ns:ns>/rollback", views.rollback, name="rollback"),
    path("ns/<ns:ns>/fence", views.fence, name="fence"),
    path("ns/<ns:ns>/resume", views.resume, name="resume"),
    path("ns/<ns:ns>/mismatches", views.mismatches, name="mismatches"),
    path("mismatches/<int:mismatch_id>", views.mismatch_detail, name="mismatch"),
    path("mismatches/<int:mismatch_id>/mark", views.mismatch_mark, name="mismatch-mark"),
    path("tasks/", claim_views.tasks, name="tasks"),
    path("tasks/<task_id:task_id>", claim_views.task_detail, name="task"),
    path("effects/", claim_views.effects, name="effects"),
    path("effects/<effect_id:effect_id>/reconcile", claim_views.effect_reconcile, name="effect-reconcile"),
    path("effects/<effect_id:effect_id>/approve", claim_views.effect_approve, name="effect-approve"),
    path("pools/", views.pools, name="pools"),
    path("glance/", views.glance, name="glance"),
]
