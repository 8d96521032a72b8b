"""Telling waiting claims that tasks became claimable (claim-v1.md §9 ``wait_seconds``): a hint, never a decision.

After a transaction that made tasks claimable commits — tasks created READY, released, requeued, unblocked by a
commit, claims ended by a fence — one ``pg_notify`` is sent on the connection, in autocommit: outside the decision's
transaction, so no commit ever waits on PostgreSQL's notification queue. The payload is ``"<count> <namespace>"``;
``claims.waiting`` wakes at most ``count`` waiters of that namespace in each process. A notification that is lost
(the send failed, a listener was reconnecting) only delays a waiter until its wait ends or the next notification: the
claim itself is always decided by the claim's own transaction. Nothing is sent on SQLite, where waiters poll.
"""

from __future__ import annotations

import logging

from django.db import DatabaseError, connection, transaction

CHANNEL = "claims_claimable"
EVERYONE = 1_000_000  # a fence or a resume: every waiter of the namespace looks again
log = logging.getLogger(__name__)


def claimable(namespace: str, count: int = 1) -> None:
    """Inside the caller's transaction: once it commits, say that ``count`` tasks of ``namespace`` became
    claimable."""
    if connection.vendor != "postgresql" or count <= 0:
        return
    transaction.on_commit(lambda: _send(namespace, count))


def _send(namespace: str, count: int) -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, f"{count} {namespace}"])
    except DatabaseError:  # a hint only: the waiters' own timers bound the delay
        log.warning("could not notify waiting claims of namespace %s", namespace, exc_info=True)
