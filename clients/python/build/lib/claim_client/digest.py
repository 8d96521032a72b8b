"""Digests as claim.v1 defines them (claim-v1.md §1): ``sha256:`` + hex SHA-256 of the canonical JSON (sorted keys,
no spaces, UTF-8). The server computes them the same way; the SDK's tests check the two agree."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()
