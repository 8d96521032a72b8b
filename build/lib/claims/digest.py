"""Digests as the contract defines them (claim-v1.md §1). Clients compute them the same way."""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def digest(value: Any) -> str:
    """``sha256:`` + hex SHA-256 of the canonical JSON of ``value``."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def effect_id(task_id: str, node_id: str, effect_slot: str) -> str:
    """Plain hex SHA-256 of ``task_id\\nnode_id\\neffect_slot``: never includes attempt or payload."""
    return hashlib.sha256(f"{task_id}\n{node_id}\n{effect_slot}".encode()).hexdigest()
