"""Every Celery job's runs recorded (``services.jobs.job_record``): the start from ``task_prerun``, the end and
its outcome from ``task_postrun``, a failure's error from ``task_failure``. Connected once, when the core app is
ready; eager runs (the test suite's) are recorded the same way."""

from __future__ import annotations

from typing import Any

from celery import signals
from django.db import DatabaseError, connection

from . import clock
from .services.jobs import job_record

_started: dict[str, Any] = {}  # Celery's task id → when it started, in this worker process
_errors: dict[str, str] = {}


def _prerun(task_id: str | None = None, **_: Any) -> None:
    if not task_id:
        return
    try:
        _started[task_id] = clock.now()
    except DatabaseError:  # the worker's connection died with the database (a restart, a failover): a new one
        connection.close()
        _started[task_id] = clock.now()


def _failure(task_id: str | None = None, exception: BaseException | None = None, **_: Any) -> None:
    if task_id:
        _errors[task_id] = repr(exception)


def _postrun(task_id: str | None = None, task: Any = None, state: str | None = None, **_: Any) -> None:
    started = _started.pop(task_id, None) if task_id else None
    error = _errors.pop(task_id, "") if task_id else ""
    if started is not None and task is not None:
        job_record(job=task.name, started_at=started, outcome=state or "SUCCESS", error=error)


def connect() -> None:
    signals.task_prerun.connect(_prerun, weak=False, dispatch_uid="claims.job_runs.prerun")
    signals.task_failure.connect(_failure, weak=False, dispatch_uid="claims.job_runs.failure")
    signals.task_postrun.connect(_postrun, weak=False, dispatch_uid="claims.job_runs.postrun")
