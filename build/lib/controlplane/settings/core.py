"""The claim.v1 core alone: every setting of the whole control plane, without the rollout app — no stages, no
legacy API, no rollout jobs. ``DJANGO_SETTINGS_MODULE=controlplane.settings.core``; what removing the rollout
means is in docs/architecture.md ("Removing the rollout")."""

from __future__ import annotations

from . import *  # noqa: F401,F403
from . import CELERY_BEAT_SCHEDULE, INSTALLED_APPS, SPECTACULAR_SETTINGS

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "rollout"]
ROOT_URLCONF = "controlplane.urls_core"
CELERY_BEAT_SCHEDULE = {
    name: job for name, job in CELERY_BEAT_SCHEDULE.items() if not job["task"].startswith("rollout.")
}
SPECTACULAR_SETTINGS = {
    **SPECTACULAR_SETTINGS,
    "DESCRIPTION": (
        "Fenced claims for multi-agent work (the claim.v1 core alone, without the rollout). Outcome words, "
        "fields and status codes follow the frozen claim.v1 contract. Every namespace is V1_ONLY, claim.v1."
    ),
}
