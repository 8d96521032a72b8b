"""Each request's thread for Django's thread-sensitive work, lent from the process's idle ones, not started anew.

Under ASGI Django runs a request's sync work — a sync view or middleware, ``response.close()`` and the
``request_finished`` receivers it fires — on one thread of that request's own (``ThreadSensitiveContext``: asgiref
makes a one-thread executor per request, and on the way out starts a second thread to join the first). On the batched
worker path the only such call is closing the response, and starting and joining those two threads was a tenth of a
server process's CPU (docs/benchmarks.md, "The batched bar").

Here the ASGI application (``controlplane.asgi``) enters each request in a ``ThreadSensitiveContext`` of its own
whose executor is a loan: on its first thread-sensitive call the request borrows an idle one-thread executor of this
process (a new one when none is idle) and keeps it to itself until the request is done, when it goes back to the
idle ones. The same one-request-at-a-time thread Django gives — Django's own context inside it then changes nothing —
minus the start and the join. ``IDLE`` are kept; past that a returned thread is stopped. A thread still running a
call when its request ended (it should not happen: Django awaits every call it makes) is never lent again.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any

from asgiref.sync import ThreadSensitiveContext

IDLE = 16


class Lender:
    """This process's idle one-thread executors."""

    def __init__(self, idle: int = IDLE) -> None:
        self._idle: list[ThreadPoolExecutor] = []
        self._keep = idle
        self._lock = threading.Lock()
        self.started = 0  # threads started so far (what the tests count)

    def borrow(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            self.started += 1
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="request")

    def take_back(self, executor: ThreadPoolExecutor) -> None:
        with self._lock:
            if len(self._idle) < self._keep:
                self._idle.append(executor)
                return
        executor.shutdown(wait=False)

    def idle(self) -> int:
        with self._lock:
            return len(self._idle)


class _Loan(Executor):
    """One request's executor: a borrowed thread, taken on its first call."""

    def __init__(self, lender: Lender) -> None:
        self._lender = lender
        self._executor: ThreadPoolExecutor | None = None
        self._last: Future[Any] | None = None

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if self._executor is None:
            self._executor = self._lender.borrow()
        self._last = self._executor.submit(fn, *args, **kwargs)
        return self._last

    def give_back(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        if self._last is not None and not self._last.done():
            executor.shutdown(wait=False)  # its thread finishes that call and stops
            return
        self._lender.take_back(executor)


LENDER = Lender()


@asynccontextmanager
async def request_thread(lender: Lender = LENDER) -> AsyncIterator[None]:
    """The request inside: its thread-sensitive calls run on one borrowed thread, given back at the end."""
    loan = _Loan(lender)
    try:
        async with ThreadSensitiveContext(executor=loan):
            yield
    finally:
        loan.give_back()
