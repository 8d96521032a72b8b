"""Settings: ``base`` plus one module per concern. ``controlplane.settings.test`` for the suite."""

from __future__ import annotations

from .base import *  # noqa: F401,F403
from .celery import *  # noqa: F401,F403
from .logging import *  # noqa: F401,F403
