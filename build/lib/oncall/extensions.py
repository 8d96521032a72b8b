"""What an app wrapping the core adds to the on-call tools. Each is a function the app registers in its
``AppConfig.ready`` (as the rollout does, rollout/extensions.py); the tools call every one registered, and with none
show the core's own facts only.

- ``namespace_facts(namespace, now)``: facts about a namespace for the overview row and the incident header —
  ``stage``, ``rollback`` and what it waits on, ``jobs_behind`` (more reasons the jobs look behind),
  ``last_drain_check_age``, ``mismatches``;
- ``namespace_pages(name)``: the app's pages for a namespace, ``[{"label", "href"}]``, its main page first — no
  database read (the on-call pages link to them and send an action back to the first);
- ``extra_leases(namespace, now, pool)``: live leases the app holds outside claim.v1 (the legacy API's), counted
  by the drain figures and the pools page;
- ``worker_rows(now, held)``: the pools page's worker rows, when the app knows the fleet better than the
  principals do (the rollout's registrations: protocol, binary, heartbeat).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from claims.models import Namespace

NamespaceFacts = Callable[[Namespace, datetime], dict[str, Any]]
ExtraLeases = Callable[[Namespace, datetime, "str | None"], list[Any]]
WorkerRows = Callable[[datetime, dict[tuple[str, str], int]], list[dict[str, Any]]]

_facts: list[NamespaceFacts] = []
_pages: list[Callable[[str], list[dict[str, str]]]] = []
_leases: list[ExtraLeases] = []
_workers: list[WorkerRows] = []


def namespace_facts(function: NamespaceFacts) -> NamespaceFacts:
    _facts.append(function)
    return function


def namespace_pages(function: Callable[[str], list[dict[str, str]]]) -> Callable[[str], list[dict[str, str]]]:
    _pages.append(function)
    return function


def pages_of(name: str) -> list[dict[str, str]]:
    return [page for function in _pages for page in function(name)]


def extra_leases(function: ExtraLeases) -> ExtraLeases:
    _leases.append(function)
    return function


def worker_rows(function: WorkerRows) -> WorkerRows:
    _workers.append(function)
    return function


def facts_of(namespace: Namespace, now: datetime) -> dict[str, Any]:
    """Every registered app's facts about ``namespace``, with its pages as ``links``; lists (``jobs_behind``) are
    joined."""
    merged: dict[str, Any] = {"jobs_behind": [], "links": pages_of(namespace.name)}
    for function in _facts:
        for key, value in function(namespace, now).items():
            if isinstance(merged.get(key), list):
                merged[key] = merged[key] + list(value)
            else:
                merged[key] = value
    return merged


def leases_of(namespace: Namespace, now: datetime, pool: str | None) -> list[Any]:
    return [lease for function in _leases for lease in function(namespace, now, pool)]


def workers_of(now: datetime, held: dict[tuple[str, str], int]) -> list[dict[str, Any]] | None:
    """The registered apps' worker rows, or None when no app registered any (the principals are shown)."""
    if not _workers:
        return None
    return [row for function in _workers for row in function(now, held)]
