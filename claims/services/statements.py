"""The hot path's hand-written SQL, in one place, each statement named by what it does. The services run them
through ``_sql`` (Django's value adaptation and converters without the query compiler) inside their own
transactions; which locks a statement takes is in its text, and the lock order they follow is in
docs/architecture.md ("The rule, and the lock order").

On SQLite (writers serialised whole by BEGIN IMMEDIATE) the lock clauses are left out (``_sql.lock_clause``).
"""

from __future__ import annotations

from ..models import Task
from . import _sql

NAMESPACE = "claims_namespace"
TASK = "claims_task"
STAGED = "claims_stagedresult"


def after_locks(sql: str) -> str:
    """Wrap a locking SELECT so that the database clock is read once its row locks are held.

    ``statement_timestamp()`` is the instant a statement *started*: a statement that waited on a row lock would
    judge a lease on a clock from before the wait, and a lease that ran out meanwhile — while another
    transaction took the task or its resource — would still look live. The materialised CTE takes the locks;
    the outer SELECT evaluates ``clock_timestamp()`` per row it reads from the CTE, that is after the lock is
    held. One statement, one round trip. On SQLite the server's clock is read in Python: NULL here.

    On PostgreSQL the same statement checks the history it decides on (``claims_serving_check()``, migration 0024;
    evaluated once, as an InitPlan): after a failover or a change of synchronous replication it raises SQLSTATE
    P0F01 instead, before anything is decided, and ``services.serving`` records the new history first."""
    if not _sql.is_postgres():
        return f"SELECT locked.*, NULL AS db_now FROM ({sql}) locked"
    return (
        f"WITH locked AS MATERIALIZED ({sql}) SELECT locked.*, clock_timestamp() AS db_now, "
        "(SELECT claims_serving_check()) AS db_timeline FROM locked"
    )


def lock_rows(table: str, where: str, order: str, lock: str) -> str:
    """Rows of ``table`` locked in ``order`` (the lock order's tie-break), then the clock."""
    return after_locks(f"SELECT * FROM {table} WHERE {where} ORDER BY {order}{_sql.lock_clause(lock)}")


CLOCK_NOW = "SELECT clock_timestamp()"  # the clock now, when there was nothing further to lock


def hold_namespace_row(*, by_task: bool, lock: str) -> str:
    """The namespace (by name, or as the namespace of a task) under ``lock``, then the clock.
    Params: [name] or [task_id]."""
    where = f"n.id = (SELECT t.namespace_id FROM {TASK} t WHERE t.task_id = %s)" if by_task else "n.name = %s"
    return after_locks(
        f"SELECT n.id, n.name, n.scheduler_epoch, n.claims_paused, n.pause_hold FROM {NAMESPACE} n "
        f"WHERE {where}{_sql.lock_clause(lock)}"
    )


def _task_columns_but_input() -> str:
    return ", ".join(
        f"t.{_sql.column(Task, f.attname)}" for f in Task._meta.concrete_fields if f.attname != "input"
    )


def _tasks_with_namespaces(where: str, columns: str = "t.*") -> str:
    """Task rows FOR NO KEY UPDATE, each with its namespace's columns (``ns_*``) FOR SHARE, then the clock."""
    return after_locks(
        f"SELECT {columns}, n.name AS ns_name, n.scheduler_epoch AS ns_epoch, n.claims_paused AS ns_paused, "
        f"n.pause_hold AS ns_hold "
        f"FROM {TASK} t JOIN {NAMESPACE} n ON n.id = t.namespace_id WHERE {where}"
        + (" FOR NO KEY UPDATE OF t FOR SHARE OF n" if _sql.is_postgres() else "")
    )


def hold_task_and_namespace() -> str:
    """The task row FOR NO KEY UPDATE and its namespace FOR SHARE, one statement, then the clock. Params:
    [task_id]."""
    return _tasks_with_namespaces("t.task_id = %s")


def hold_tasks_and_namespaces(count: int) -> str:
    """``count`` task rows FOR NO KEY UPDATE in task_id order, each with its namespace FOR SHARE, one statement;
    each row carries the clock read after its lock (the caller takes the latest). Params: [*task_ids]. The tasks'
    inputs are left deferred: a commit never reads one, and each may be up to ``CLAIMS_MAX_VALUE_BYTES``."""
    return _tasks_with_namespaces(
        f"t.task_id IN ({', '.join(['%s'] * count)}) ORDER BY t.task_id", _task_columns_but_input()
    )


def not_held(outer: str) -> str:
    """A condition: no resource of task ``outer`` is held by a live attempt of another task (§4: such tasks are
    passed over). Live = the newest token's taker is still its task's current claim, unexpired, in its current
    epoch. Params: [False, now]."""
    # The flag first: for the common task without resources the sub-select is never run (PostgreSQL plans it as
    # a per-row SubPlan behind the OR instead of an anti-join over every live claim).
    return (
        f"({outer}.has_resources = %s OR NOT EXISTS (SELECT 1 FROM claims_taskresource tr "
        "JOIN claims_resourcekey rk ON rk.resource_key = tr.resource_key_id "
        f"JOIN {TASK} h ON h.task_id = rk.holder_task_id JOIN {NAMESPACE} hn ON hn.id = h.namespace_id "
        f"WHERE tr.task_id = {outer}.task_id AND h.task_id <> {outer}.task_id AND h.state = 'CLAIMED' "
        "AND h.attempt_id = rk.holder_attempt_id AND h.lease_expires_at > %s AND h.scheduler_epoch = hn.scheduler_epoch))"
    )


# claim-v1.md §10, across READY tasks and claims to take back: a pick of one kind takes nothing of a lower priority
# than the best the other kind offers this request (``bound``: the same conditions on alias ``s``). The bound passes
# over rows another claimer is deciding on (SKIP LOCKED), as the picks do: what it names, this request could take —
# a row locked elsewhere never makes it answer nothing while it could take something. The stale bound reads the
# namespace's CLAIMED tasks from a partial index (task_claimed_epoch): the claims in flight, not the backlog.
def _stale_claims(alias: str) -> str:
    return (
        f"{alias}.namespace_id = %s AND {alias}.state = 'CLAIMED' "
        f"AND ({alias}.lease_expires_at <= %s OR {alias}.scheduler_epoch < %s)"
    )


def _priority_bound(where: str) -> str:
    return (
        f" AND c.priority <= COALESCE((SELECT s.priority FROM {TASK} s WHERE {where} ORDER BY s.priority LIMIT 1"
        f"{_sql.lock_clause('FOR NO KEY UPDATE SKIP LOCKED')}), 32767)"
    )


def pick_ready(*, extra: str, bound: str) -> str:
    """A claim's READY picks in one statement (PostgreSQL): up to ``n`` of the namespace's READY tasks in grant order
    (priority, then place in the fair share: ``services.fair_share``) that nobody else is deciding on (SKIP LOCKED:
    N callers take N different tasks), none of a lower priority than a claim this request could take back. Locked.
    Those that list no resource are claimed by the same statement, each with its own attempt id (``granted``); those
    that do come back locked and unclaimed — whether their keys may be taken is judged once the keys are locked, and
    at most one task per key (``resources.KeysForClaims``). Rows in no particular order. ``extra``/``bound``:
    further conditions on the candidate ``c`` / on the stale claim ``s``. Params: [namespace_id, READY, *extra's,
    namespace_id, now, epoch, *bound's, n, CLAIMED, epoch, owner_id, lease_expires_at, updated_at]."""
    return (
        f"WITH picked AS MATERIALIZED (SELECT c.* FROM {TASK} c WHERE c.namespace_id = %s AND c.state = %s{extra}"
        f"{_priority_bound(_stale_claims('s') + bound)} "
        "ORDER BY c.priority, c.vtag, c.task_id LIMIT %s FOR NO KEY UPDATE SKIP LOCKED), "
        f"claimed AS (UPDATE {TASK} t SET state = %s, claim_generation = t.claim_generation + 1, "
        "state_version = t.state_version + 1, scheduler_epoch = %s, attempt_id = gen_random_uuid(), owner_id = %s, "
        "lease_expires_at = %s, updated_at = %s FROM picked p WHERE t.task_id = p.task_id AND NOT p.has_resources "
        "RETURNING t.*) "
        "SELECT claimed.*, TRUE AS granted FROM claimed "
        "UNION ALL SELECT picked.*, FALSE AS granted FROM picked WHERE picked.has_resources"
    )


def pick_candidates(*, reclaim: bool, extra: str, bound: str) -> str:
    """Up to ``n`` candidates locked and not yet claimed (SKIP LOCKED), in grant order: READY tasks (SQLite, where
    writers are serialised whole; none of a lower priority than a claim this request could take back), or —
    ``reclaim`` — the claims whose lease ran out or that a fence ended, by priority, then the first to run out
    (none of a lower priority than a READY task this request could take). ``bound``: the conditions of ``extra``
    on alias ``s``. Params: [namespace_id, READY or CLAIMED, (now, epoch if reclaim), *extra's, (namespace_id,
    READY if reclaim, else namespace_id, now, epoch), *bound's, n]."""
    if reclaim:
        where, order = (
            " AND (c.lease_expires_at <= %s OR c.scheduler_epoch < %s)",
            "c.priority, c.lease_expires_at, c.task_id",
        )
        other = f"s.namespace_id = %s AND s.state = %s{bound}"
    else:
        where, order = "", "c.priority, c.vtag, c.task_id"
        other = f"{_stale_claims('s')}{bound}"
    return (
        f"SELECT c.* FROM {TASK} c WHERE c.namespace_id = %s AND c.state = %s{where}{extra}{_priority_bound(other)} "
        f"ORDER BY {order} LIMIT %s{_sql.lock_clause('FOR NO KEY UPDATE SKIP LOCKED')}"
    )


def make_canonical() -> str:
    """The commit's check 5 and its canonical flip in one statement: this attempt's staged result with this
    digest becomes canonical, or no row comes back (NOT_STAGED). The partial unique index
    one_canonical_commit_per_task makes a second canonical row impossible. Params: [True, commit_id,
    committed_at, unblocked, attempt_id, result_digest]."""
    return (
        f"UPDATE {STAGED} SET canonical = %s, commit_id = %s, committed_at = %s, "
        "unblocked = %s WHERE attempt_id = %s AND result_digest = %s RETURNING *"
    )


def lock_blocked_successors() -> str:
    """A committed task's BLOCKED successors, locked FOR NO KEY UPDATE in key order (two committers of
    predecessors of one task never deadlock). Params: [task_id, BLOCKED]."""
    return (
        f"SELECT t.task_id FROM {TASK} t JOIN claims_taskdependency d ON d.task_id = t.task_id "
        "WHERE d.depends_on_id = %s AND t.state = %s ORDER BY t.task_id"
        + _sql.lock_clause("FOR NO KEY UPDATE OF t")
    )


def lock_predecessor_states(count: int, lock: str) -> str:
    """The states of ``count`` predecessors in one namespace, each row locked in key order (PostgreSQL only).
    Params: [*task_ids, namespace_id]."""
    placeholders = ",".join(["%s"] * count)
    return (
        f"SELECT task_id, state FROM {TASK} WHERE task_id IN ({placeholders}) AND namespace_id = %s "
        f"ORDER BY task_id {lock}"
    )
