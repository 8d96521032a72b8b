"""What every service shares: holding the namespace's epoch, locking a task, appending events and audit
entries, and logging a rejection in its own small transaction."""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime
from types import TracebackType
from typing import Any

from celery import current_app
from django.db import connection, models, transaction

from .. import clock
from ..errors import Conflict, NotFound
from ..models import AuditEntry, EventKind, Principal, Task, TaskEvent
from . import _sql, statements


@dataclass(frozen=True)
class NamespaceHold:
    """The namespace row as read under its lock, and the database's clock read once the locks were held."""

    id: int
    name: str
    scheduler_epoch: int
    claims_paused: bool
    now: datetime
    pause_hold: str = ""

    def at(self, db_now: datetime | None) -> NamespaceHold:
        """The same hold, judged on a clock read later — after a further lock was taken (``locked_rows``)."""
        return replace(self, now=clock.from_db(db_now))

    def on(self, task_id: str, principal: Principal | None, **fields: Any) -> dict[str, Any]:
        """A timeline row's fields for ``task_id`` in this namespace, on this hold's clock (``new_event`` and its
        kin take them with the kind)."""
        return {"namespace_id": self.id, "task_id": task_id, "at": self.now, "principal": principal, **fields}

    def audit(self, principal: Principal, action: str, **fields: Any) -> None:
        """An audit entry for this namespace on this hold's clock (``audit``)."""
        audit(principal=principal, action=action, at=self.now, namespace=self.name, **fields)


def locked_rows(
    model: type[models.Model], where: str, params: list[Any], *, order: str, lock: str
) -> tuple[list[Any], Any]:
    """Rows of ``model`` matching ``where``, locked in ``order`` (the documented lock order's tie-break), and the
    database clock read after the locks are held (None on SQLite: ``NamespaceHold.at`` reads the server's)."""
    rows = _sql.load(model, statements.lock_rows(model._meta.db_table, where, order, lock), params)
    if rows:
        return rows, rows[0].db_now
    if not _sql.is_postgres():
        return rows, None
    with connection.cursor() as cursor:  # nothing to lock: the clock now is after every lock we hold
        cursor.execute(statements.CLOCK_NOW)
        return rows, cursor.fetchone()[0]


def hold_namespace(*, name: str | None = None, task_id: str | None = None) -> NamespaceHold:
    """Read the namespace (by name, or as the namespace of ``task_id``) and hold its epoch steady.

    On PostgreSQL the row is taken FOR SHARE: an epoch fence UPDATEs it, so a fence waits for every decision
    already in flight, and every decision that starts after the fence reads the new epoch. This closes the race
    in which a claim or commit reads epoch N, a fence commits N+1, and the old-epoch decision lands afterwards.
    The clock is read after the lock is held (``statements.after_locks``).
    SQLite runs each transaction BEGIN IMMEDIATE, so writers are serialised whole and no lock is needed.
    Raises NotFound for an unknown namespace or task.
    """
    return _namespace_row(name=name, task_id=task_id, lock="FOR SHARE")


def namespace_lock(*, name: str) -> NamespaceHold:
    """The namespace row FOR NO KEY UPDATE — the strongest lock any service takes on it, taken first by every
    service that writes the row (fence, resume, stage changes), never after a FOR SHARE of the same row: two
    transactions that both hold FOR SHARE and then both ask to upgrade deadlock. Clock read after the lock."""
    return _namespace_row(name=name, task_id=None, lock="FOR NO KEY UPDATE")


def _namespace_row(*, name: str | None, task_id: str | None, lock: str) -> NamespaceHold:
    sql = statements.hold_namespace_row(by_task=task_id is not None, lock=lock)
    with connection.cursor() as cursor:
        cursor.execute(sql, [task_id if task_id is not None else name])
        row = cursor.fetchone()
    if row is None:
        raise NotFound("no such task" if task_id is not None else f"no such namespace: {name}")
    return NamespaceHold(
        id=row[0],
        name=row[1],
        scheduler_epoch=row[2],
        claims_paused=bool(row[3]),
        pause_hold=row[4],
        now=clock.from_db(row[5]),
    )


def hold_task(task_id: str) -> tuple[NamespaceHold, Task]:
    """The task row FOR NO KEY UPDATE and its namespace FOR SHARE in one statement, then the database clock.

    The task lock: the decision and the write that follows it see one version of the row, and a concurrent
    writer of the same task waits for this transaction (then re-reads the new version). The namespace lock is
    ``hold_namespace``'s. The clock is read after both locks are held (``statements.after_locks``), so a lease is judged on
    the instant the decision is made, not on the instant the statement began to wait. Nothing takes a namespace
    row exclusively and then waits for a task row (an epoch fence touches attempts, never task locks), so taking
    both in one statement cannot deadlock. Raises NotFound for an unknown task.
    """
    rows = _sql.load(Task, statements.hold_task_and_namespace(), [task_id])
    if not rows:
        raise NotFound("no such task")
    task = rows[0]
    return _held(task, clock.from_db(task.db_now)), task


def hold_tasks(task_ids: list[str]) -> dict[str, tuple[NamespaceHold, Task]]:
    """``hold_task`` for several tasks in one statement: the task rows FOR NO KEY UPDATE in task_id order (the
    lock order's tie-break among tasks, so two batches naming the same tasks queue, never deadlock), each with its
    namespace FOR SHARE, then one clock for all, the latest read — after every one of the locks is held. Unknown
    tasks are absent from the answer."""
    if not task_ids:
        return {}
    rows = _sql.load(Task, statements.hold_tasks_and_namespaces(len(task_ids)), list(task_ids))
    if not rows:
        return {}
    stamps = [row.db_now for row in rows if row.db_now is not None]
    now = clock.from_db(max(stamps) if stamps else None)
    return {task.pk: (_held(task, now), task) for task in rows}


def _held(task: Any, now: datetime) -> NamespaceHold:
    """The namespace as the holding statement read it with the task (its ``ns_*`` columns)."""
    return NamespaceHold(
        id=task.namespace_id,
        name=task.ns_name,
        scheduler_epoch=task.ns_epoch,
        claims_paused=bool(task.ns_paused),
        pause_hold=task.ns_hold,
        now=now,
    )


def task_current(task: Task, ns: NamespaceHold) -> dict[str, Any]:
    """The authoritative values a client needs after a 409 (claim-v1.md §2)."""
    return {
        "state": task.state,
        "state_version": task.state_version,
        "scheduler_epoch": ns.scheduler_epoch,
        "claim_generation": task.claim_generation,
        "cancel_generation": task.cancel_generation,
        "input_digest": task.input_digest,
    }


class Guard:
    """What a wrapping app runs inside the transaction of a decision made under ``guarded``. The core does not know
    what is checked or written; it only calls, at each acceptance point:

    - ``check(point, ns)`` once the namespace is held (FOR SHARE) and before anything is decided — the app makes its
      own reads under the same lock and may refuse (any exception rolls the decision back; one that is not a
      ``Conflict`` is not logged as a rejection);
    - ``settle(point, ns, value)`` once the decision is written, before its transaction commits — the app writes
      its own records of the decision (``value``: the service's answer) in the same transaction, under the same
      locks, after every lock the core took. A refused decision is never settled;
    - ``keeps_claim_keys(ns)`` after ``check``: whether a claim's ``Idempotency-Key`` is answered here.
    """

    def check(self, point: str, ns: NamespaceHold) -> None:
        pass

    def settle(self, point: str, ns: NamespaceHold, value: Any) -> None:
        pass

    def keeps_claim_keys(self, ns: NamespaceHold) -> bool:
        """Whether a claim's ``Idempotency-Key`` is kept and answered here (``claim_keys``), asked after ``check``:
        not where the app has another store decide the grant."""
        return True


_guard: contextvars.ContextVar[Guard | None] = contextvars.ContextVar("claims_guard", default=None)


@contextmanager
def guarded(guard: Guard) -> Iterator[None]:
    """Decisions made inside this block run ``guard``'s hooks (``Guard``)."""
    token = _guard.set(guard)
    try:
        yield
    finally:
        _guard.reset(token)


def run_guard(point: str, ns: NamespaceHold) -> None:
    guard = _guard.get()
    if guard is not None:
        guard.check(point, ns)


def keeps_claim_keys(ns: NamespaceHold) -> bool:
    guard = _guard.get()
    return guard is None or guard.keeps_claim_keys(ns)


def settle(point: str, ns: NamespaceHold, value: Any) -> None:
    """The decision at ``point`` is written: the wrapping app's ``Guard.settle``, inside the same transaction."""
    guard = _guard.get()
    if guard is not None:
        guard.settle(point, ns, value)


_via: contextvars.ContextVar[str] = contextvars.ContextVar("claims_via", default="")
_synthetic: contextvars.ContextVar[bool] = contextvars.ContextVar("claims_synthetic", default=False)


@contextmanager
def synthetic() -> Iterator[None]:
    """Requests made inside this block are the control plane's own probes (the fence's self-check): their
    rejection is not traffic, so it is neither logged on a timeline nor counted at an acceptance point — a
    synthetic check never counts toward a gate."""
    token = _synthetic.set(True)
    try:
        yield
    finally:
        _synthetic.reset(token)


@contextmanager
def acting_via(protocol: str) -> Iterator[None]:
    """Requests made inside this block were passed on by another app from ``protocol``: the timeline rows they
    write say so (``TaskEvent.via``). The core judges them like any other; what the label means — the rollout
    counts such requests as not validated — is the caller's business."""
    token = _via.set(protocol)
    try:
        yield
    finally:
        _via.reset(token)


def event_values(
    kind: EventKind,
    *,
    namespace_id: int,
    task_id: str | None,
    at: datetime,
    principal: Principal | None,
    attempt_id: Any = None,
    claim_generation: int | None = None,
    scheduler_epoch: int | None = None,
    owner_id: str | None = None,
    point: str | None = None,
    detail: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One timeline row. ``point`` marks a request that reached an acceptance point; ``via`` the protocol it was
    passed on from, if any (``acting_via``)."""
    return {
        "namespace_id": namespace_id,
        "task_id": task_id,
        "kind": kind,
        "at": at,
        "attempt_id": attempt_id,
        "claim_generation": claim_generation,
        "scheduler_epoch": scheduler_epoch,
        "owner_id": owner_id,
        "principal": principal.name if principal else "",
        "point": point,
        "via": _via.get(),
        "detail": detail or {},
    }


def new_event(kind: EventKind, **fields: Any) -> TaskEvent:
    """An unsaved event, for bulk_create."""
    return TaskEvent(**event_values(kind, **fields))


def event_statement(kind: EventKind, **fields: Any) -> _sql.Statement:
    """The INSERT of one event, to run with the writes it describes (``_sql.together``)."""
    return _sql.insert_statement(TaskEvent, **event_values(kind, **fields))


def append_event(kind: EventKind, **fields: Any) -> None:
    """Append one event inside the caller's transaction (with the other writes of a ``writes_together`` block)."""
    _sql.write(event_statement(kind, **fields))


def audit(
    *,
    principal: Principal,
    action: str,
    at: datetime,
    namespace: str = "",
    target: str = "",
    reason: str = "",
    detail: dict[str, Any] | None = None,
) -> None:
    """Append to the operator audit log, inside the caller's transaction."""
    AuditEntry.objects.create(
        at=at,
        principal=principal.name,
        role=principal.role,
        action=action,
        namespace=namespace,
        target=target,
        reason=reason,
        detail=detail or {},
    )


class RejectionLog:
    """Wraps one acceptance-point decision. A Conflict raised inside rolls the decision back (the caller's
    transaction is already gone when ``__exit__`` runs) and is then appended as a `fenced` event in its own
    small transaction, so a rejected request leaves every record as it was but is still counted (claim-v1.md §2).
    The service sets ``namespace_id`` (and ``task_id``) as soon as it knows them."""

    def __init__(
        self,
        point: str,
        *,
        principal: Principal | None,
        task_id: str | None = None,
        attempt_id: Any = None,
        claim_generation: int | None = None,
        scheduler_epoch: int | None = None,
        owner_id: str | None = None,
    ):
        self.point = point
        self.principal = principal
        self.namespace_id: int | None = None
        self.task_id = task_id
        self.attempt_id = attempt_id
        self.claim_generation = claim_generation
        self.scheduler_epoch = scheduler_epoch
        self.owner_id = owner_id

    def __enter__(self) -> RejectionLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if isinstance(exc, Conflict) and self.records(exc):
            with transaction.atomic(durable=True):
                _sql.together(self.statement(exc, at=clock.now()))

    def records(self, exc: BaseException | None) -> bool:
        """Whether ``exc`` is logged: a protocol rejection, with its namespace known, that is not a synthetic probe."""
        return isinstance(exc, Conflict) and self.namespace_id is not None and not _synthetic.get()

    def statement(self, exc: Conflict, *, at: datetime) -> _sql.Statement:
        return _sql.insert_statement(TaskEvent, **self.event(exc, at=at))

    def event(self, exc: Conflict, *, at: datetime) -> dict[str, Any]:
        """The `fenced` event recording ``exc``. A caller that decides several requests in one transaction
        (``task_commit_many``) writes these itself, with its own writes, where ``records`` says so."""
        assert self.namespace_id is not None
        return event_values(
            EventKind.FENCED,
            namespace_id=self.namespace_id,
            task_id=self.task_id,
            at=at,
            principal=self.principal,
            attempt_id=self.attempt_id,
            claim_generation=self.claim_generation,
            scheduler_epoch=self.scheduler_epoch,
            owner_id=self.owner_id,
            point=self.point,
            detail={"outcome": exc.outcome, "reason": exc.reason},
        )


def enqueue(job: str, *args: Any) -> None:
    """Send a Celery job by its registered name (each app's ``tasks.py``): jobs call services, never the other way, so
    a service names the job instead of importing it. The registered task itself, so an eager configuration runs
    it in place and a worker receives it otherwise."""
    current_app.tasks[job].delay(*args)


def task_let_go(task: Task, state: str, now: datetime, *also: str) -> None:
    """The task leaves its holder, inside the caller's transaction: ``state``, a new state_version, no attempt,
    owner or lease — saved with ``also``, the fields the caller changed too."""
    task.state = state
    task.state_version += 1
    task.attempt_id = task.owner_id = task.lease_expires_at = None
    task.updated_at = now
    fields = ["state", *also, "state_version", "attempt_id", "owner_id", "lease_expires_at", "updated_at"]
    task.save(update_fields=fields)
