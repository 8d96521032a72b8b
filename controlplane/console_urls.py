"""The operator console's URLs (server-rendered pages; the API lives under /api/): the on-call pages, the rollout's,
and the core's task and effect pages."""

from __future__ import annotations

from oncall.urls import console_pages as oncall_pages
from rollout.urls import console_pages as rollout_pages

from .console_core_urls import core_pages

app_name = "console"

urlpatterns = [*oncall_pages, *rollout_pages, *core_pages]
