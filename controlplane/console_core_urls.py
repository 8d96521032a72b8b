"""The console without the rollout: the claim.v1 core's pages (tasks, effects, the audit log) and the on-call
pages. The whole console (controlplane/console_urls.py) adds the rollout's pages to these."""

from __future__ import annotations

from django.urls import path

from claims import views as claim_views
from claims.urls import EffectIdConverter, NameConverter, TaskIdConverter  # noqa: F401  (registers converters)
from gateway.urls import console_pages as gateway_pages
from oncall.urls import console_pages as oncall_pages

app_name = "console"

core_pages = [
    path("tasks/", claim_views.tasks, name="tasks"),
    path("tasks/<task_id:task_id>", claim_views.task_detail, name="task"),
    path("tasks/<task_id:task_id>/priority", claim_views.task_priority, name="task-priority"),
    path("effects/", claim_views.effects, name="effects"),
    path("audit/", claim_views.audit, name="audit"),
    path("effects/<effect_id:effect_id>/reconcile", claim_views.effect_reconcile, name="effect-reconcile"),
    path("effects/<effect_id:effect_id>/approve", claim_views.effect_approve, name="effect-approve"),
    *gateway_pages,
]

urlpatterns = [*oncall_pages, *core_pages]
