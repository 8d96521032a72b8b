"""Our models live in the default database only. Any other alias is someone else's — the team's legacy database
(``DATABASES["legacy"]``, from LEGACY_DATABASE_URL) above all: no migration of ours runs there (not even a data
migration's RunPython), and no model of ours is read from or written to it — the legacy table adapter speaks to it
in SQL of its own (rollout.legacy_table)."""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS


class LegacyDatabaseRouter:
    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return None  # the default database, for every model

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return None

    def allow_migrate(
        self, db: str, app_label: str, model_name: str | None = None, **hints: Any
    ) -> bool | None:
        return db == DEFAULT_DB_ALIAS
