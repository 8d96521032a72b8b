"""The mapping of a team's legacy claim table (``ROLLOUT_LEGACY_TABLE``, docs/adopting.md): where its columns keep what
a claim is, checked when it is parsed; ``legacy_check`` checks it against the live table."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]*(\.[A-Za-z_][A-Za-z0-9_$]*)?$")
COMPLETED_AS = ("owner", "true", "now")


@dataclass(frozen=True)
class TableMapping:
    """Where the legacy table keeps what a claim is. Column names as the table has them."""

    table: str
    key: str
    owner: str
    expires: str
    result: str = ""
    completed: str = ""
    completed_as: str = "owner"
    namespace: str = "default"  # every row's namespace, unless namespace_column names the column holding it
    namespace_column: str = ""
    database: str = "legacy"  # the DATABASES alias
    changed: str = (
        ""  # their updated-at column: observe mode's clock (binlog, polling) and the polling cursor
    )
    # namespace_column's values → namespaces ({"billing": "billing-jobs"}); with a map, a value it lacks is of none
    namespace_map: dict[str, str] = field(default_factory=dict)
    input: str = ""  # the column a task's input is read from when the table's rows are imported (else {})
    node: str = "legacy"  # the node_id of the tasks imported from the table
    version: str = (
        ""  # a per-row counter the adapter increments on every write it makes (their optimistic checks)
    )
    updated_at: str = ""  # a column the adapter sets to the database's clock on every write it makes
    released_owner: str = "null"  # what a release leaves in the owner column: null, or empty ('')

    def __post_init__(self) -> None:
        for label in (
            "table",
            "key",
            "owner",
            "expires",
            "result",
            "completed",
            "namespace_column",
            "changed",
            "input",
            "version",
            "updated_at",
        ):
            value = getattr(self, label)
            if (value or label in ("table", "key", "owner", "expires")) and not _NAME.match(value or ""):
                raise ImproperlyConfigured(
                    f"ROLLOUT_LEGACY_TABLE: {label} must name a column (letters, digits, _; a table may be "
                    f"schema.table), not {value!r}"
                )
        if self.namespace_map and not self.namespace_column:
            raise ImproperlyConfigured(
                "ROLLOUT_LEGACY_TABLE: namespace_map maps the values of namespace_column, which is not set"
            )
        if not isinstance(self.namespace_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in self.namespace_map.items()
        ):
            raise ImproperlyConfigured(
                "ROLLOUT_LEGACY_TABLE: namespace_map is an object of column values to namespace names, e.g. "
                '{"billing": "billing-jobs"}'
            )
        if self.released_owner not in ("null", "empty"):
            raise ImproperlyConfigured(
                f"ROLLOUT_LEGACY_TABLE: released_owner must be null or empty, not {self.released_owner!r}"
            )
        if self.completed_as not in COMPLETED_AS:
            raise ImproperlyConfigured(
                f"ROLLOUT_LEGACY_TABLE: completed_as must be one of {', '.join(COMPLETED_AS)}, not "
                f"{self.completed_as!r}"
            )

    @classmethod
    def parse(cls, text: str) -> TableMapping:
        """The mapping from JSON, or from the JSON file ``text`` names."""
        source = text.strip()
        if not source:
            raise ImproperlyConfigured(
                "ROLLOUT_LEGACY_TABLE is empty: set it to the mapping (JSON, or a file's path); docs/adopting.md"
            )
        if not source.startswith("{"):
            path = Path(source)
            if not path.is_file():
                raise ImproperlyConfigured(f"ROLLOUT_LEGACY_TABLE names no file: {source}")
            source = path.read_text()
        try:
            data = json.loads(source)
        except ValueError as exc:
            raise ImproperlyConfigured(f"ROLLOUT_LEGACY_TABLE is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ImproperlyConfigured("ROLLOUT_LEGACY_TABLE must be a JSON object")
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ImproperlyConfigured(
                f"ROLLOUT_LEGACY_TABLE: unknown keys {', '.join(unknown)} (known: {', '.join(sorted(known))})"
            )
        missing = [name for name in ("table", "key", "owner", "expires") if not data.get(name)]
        if missing:
            raise ImproperlyConfigured(f"ROLLOUT_LEGACY_TABLE: {', '.join(missing)} missing")
        if not all(isinstance(value, str) for name, value in data.items() if name != "namespace_map"):
            raise ImproperlyConfigured(
                "ROLLOUT_LEGACY_TABLE: every value is a string (namespace_map an object)"
            )
        return cls(**data)

    def namespace_of(self, raw: Any) -> str:
        """A row's namespace: the mapping's one, or its namespace_column's value (through namespace_map, where a
        value the map lacks is of no namespace: "")."""
        if not self.namespace_column:
            return self.namespace
        if self.namespace_map:
            return self.namespace_map.get(str(raw), "")
        return "" if raw is None else str(raw)

    def raw_values(self, namespace: str) -> list[str]:
        """The namespace_column values that are ``namespace``."""
        if self.namespace_map:
            return sorted(raw for raw, name in self.namespace_map.items() if name == namespace)
        return [namespace]

    def columns(self) -> list[str]:
        """The columns a row is read with, in order: key, owner, expires, then the optional ones mapped."""
        return [self.key, self.owner, self.expires] + [
            c for c in (self.result, self.completed, self.namespace_column) if c
        ]


@cache
def configured_mapping() -> TableMapping:
    return TableMapping.parse(settings.ROLLOUT_LEGACY_TABLE)
