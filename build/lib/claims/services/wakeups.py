"""Telling waiting claims that tasks became claimable (claim-v1.md §9 ``wait_seconds``): a hint, never a decision.

After a transaction that made tasks claimable commits, one ``pg_notify`` per namespace is sent on the connection,
in autocommit: outside the decision's transaction, so no commit ever waits on PostgreSQL's notification queue.

- ``claimable(namespace, nodes)``: tasks of these nodes became READY — created, released, requeued, unblocked;
  ``EVERYONE`` for a fence or a resume, which change who may claim anything in the namespace.
- ``keys_freed(keys)``: an attempt that held resource keys ended — committed, released, cancelled, fenced — so the
  tasks that list those keys may be claimable now, in whatever namespace and of whatever node: one more read,
  after the commit, finds them (only for attempts that held keys).

The payload is JSON ``{"ns": name, "n": count, "nodes": [node_id, …] | null}``; ``claims.waiting`` wakes at most
``n`` waiters of the namespace in each process whose ``node_ids`` filter admits one of ``nodes`` (null: any),
oldest first, and a woken waiter that cannot use its wake-up hands it on. A notification that is lost (the send
failed, a listener was reconnecting) only delays a waiter until its wait ends or the next notification: the claim
itself is always decided by the claim's own transaction. Nothing is sent on SQLite, where waiters poll.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Iterable

from django.db import DatabaseError, connection, transaction

CHANNEL = "claims_claimable"
EVERYONE = 1_000_000  # a fence or a resume: every waiter of the namespace looks again
_PAYLOAD_MAX = 7000  # pg_notify refuses 8000 bytes and more; past this the nodes are left out (any node)
log = logging.getLogger(__name__)


def claimable(namespace: str, count: int = 1, *, nodes: Iterable[str] | None = None) -> None:
    """Inside the caller's transaction: once it commits, say that ``count`` tasks of ``namespace`` — of ``nodes``,
    or of any node (None) — became claimable."""
    if connection.vendor != "postgresql" or count <= 0:
        return
    named = None if nodes is None else sorted(set(nodes))
    transaction.on_commit(lambda: _send(namespace, count, named))


def keys_freed(keys: Iterable[str]) -> None:
    """Inside the caller's transaction: an attempt holding ``keys`` ends with it. Once it commits, wake the waiters
    of the tasks that list one of them and may be claimable now (READY, or a claim whose lease ran out)."""
    keys = sorted(set(keys))
    if connection.vendor != "postgresql" or not keys:
        return
    transaction.on_commit(lambda: _send_freed(keys))


def _send_freed(keys: list[str]) -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT n.name, t.node_id FROM claims_taskresource tr "
                "JOIN claims_task t ON t.task_id = tr.task_id JOIN claims_namespace n ON n.id = t.namespace_id "
                f"WHERE tr.resource_key_id IN ({', '.join(['%s'] * len(keys))}) "
                "AND (t.state = 'READY' OR (t.state = 'CLAIMED' AND t.lease_expires_at <= clock_timestamp()))",
                keys,
            )
            rows = cursor.fetchall()
    except DatabaseError:
        log.warning("could not find the waiters of freed keys %s", keys, exc_info=True)
        return
    by_namespace: dict[str, Counter[str]] = {}
    for namespace, node in rows:
        by_namespace.setdefault(namespace, Counter())[node] += 1
    for namespace, nodes in by_namespace.items():
        _send(namespace, sum(nodes.values()), sorted(nodes))


def payload(namespace: str, count: int, nodes: list[str] | None) -> str:
    text = json.dumps({"ns": namespace, "n": count, "nodes": nodes}, separators=(",", ":"))
    if nodes is not None and len(text.encode()) > _PAYLOAD_MAX:
        return payload(namespace, count, None)
    return text


def parse(text: str) -> tuple[str, int | None, frozenset[str] | None]:
    """(namespace, count, nodes) of a payload; also reads the older ``"<count> <namespace>"`` form (any node), so a
    listener of this release understands a sender of the last during a rolling upgrade."""
    if text.startswith("{"):
        body = json.loads(text)
        nodes = body.get("nodes")
        return str(body["ns"]), int(body["n"]), None if nodes is None else frozenset(map(str, nodes))
    count, _, namespace = text.partition(" ")
    return namespace, int(count) if count.isdigit() else None, None


def _send(namespace: str, count: int, nodes: list[str] | None) -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, payload(namespace, count, nodes)])
    except DatabaseError:  # a hint only: the waiters' own timers bound the delay
        log.warning("could not notify waiting claims of namespace %s", namespace, exc_info=True)
