"""Our models live in the default database only. Any other alias is someone else's — the team's legacy database
(``DATABASES["legacy"]``, from LEGACY_DATABASE_URL) above all: no migration of ours runs there (not even a data
migration's RunPython), and no model of ours is read from or written to it — the legacy table adapter speaks to it
in SQL of its own (rollout.legacy_table)."""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS


class DefaultDatabaseOnly:
    """Reads and writes follow Django's default (this router has no opinion on them); migrations run on the default
    database alone."""

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints: Any) -> bool:
        return db == DEFAULT_DB_ALIAS
