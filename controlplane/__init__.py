from __future__ import annotations

from .celery import app as celery_app

# The one version number: the distribution's (pyproject.toml reads it from here), `claimctl --version` and /readyz.
__version__ = "0.2.0"

__all__ = ["__version__", "celery_app"]
