"""The suite's settings for the core alone (``make test`` runs tests/claims with them): ``test`` without the
rollout app."""

from __future__ import annotations

from . import core
from .test import *  # noqa: F401,F403
from .test import INSTALLED_APPS

INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "rollout"]
ROOT_URLCONF = core.ROOT_URLCONF
CELERY_BEAT_SCHEDULE = core.CELERY_BEAT_SCHEDULE
SPECTACULAR_SETTINGS = core.SPECTACULAR_SETTINGS
