"""Settings for the suite: the same as production but fast password hashing and eager-capable Celery."""

from __future__ import annotations

from . import *  # noqa: F401,F403
from .base import DATABASES

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # A file, not :memory:, so that several connections (threads) see one database.
    DATABASES["default"]["TEST"] = {"NAME": str(DATABASES["default"].get("NAME")) + ".test"}
