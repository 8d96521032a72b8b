"""Waiting claims (claim-v1.md §9 ``wait_seconds``): woken by PostgreSQL LISTEN/NOTIFY, served without a thread each.

``waiting(view)`` wraps the claim-next and batch views in an async view. The wrapped DRF view runs as always (in a
thread, as Django runs any sync view); when it found nothing and the request may wait, it returns its 204 with a
``ClaimWait`` — the namespace, how long, and how to try again. The async view then awaits, on the server's event
loop and holding no thread, the first of:

- a notification for the namespace (``services.wakeups``: a task was created READY, released, requeued, unblocked,
  or a fence or resume changed who may claim), handed out by this process's one listener;
- the namespace's first lease running out (``selectors.next_lease_expiry``), which nobody notifies;
- the end of the wait,

and tries the claim again — its own transaction decides, so a notification is a hint only. A notification that
arrives while the waiter is trying (not queued) wakes nobody; so a waiter notes when each try began and does not
queue when its namespace was notified since — it tries again at once (the lost wake-up CI once saw as a 20 s wait). Still nothing: it waits
again until the end; then one last try, and 204.

No herd: a notification for ``count`` tasks wakes at most ``count`` waiters of the namespace in each process
(oldest first); a woken waiter that finds nothing waits again. A fence or resume wakes them all (each then answers
FENCED/CLAIMS_PAUSED or claims). The listener, one PostgreSQL connection per server process, wakes every waiter when
it (re)connects, so a notification sent while it was away only delays.

Under ASGI (``controlplane.asgi``, which sets ``CONTROLPLANE_SERVER=asgi`` before the URLs are loaded) the views
are async and an idle waiter is a suspended coroutine and a future. Under WSGI (the embedded ``runserver``, the test
client, a thread that already runs an event loop) they stay sync views and a wait holds the request's thread on a
``threading.Event``. On SQLite (the embedded default) there is no listener: a waiter looks again every 0.5 s.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.core.handlers.asgi import ASGIRequest
from django.db import connection, connections
from django.http import HttpResponse

from . import clock, interleave, selectors
from .errors import ClaimError, exception_handler
from .renderers import SafeJSONRenderer
from .services.wakeups import CHANNEL

log = logging.getLogger(__name__)
POLL_SECONDS = 0.5  # SQLite, and the listener's reconnect pause


def may_wait(
    response: Any, namespace: str, seconds: float, retry: Callable[[], dict[str, Any] | None]
) -> Any:
    """Mark a claim view's 204 as one that may wait (``waiting``)."""
    if seconds > 0:
        response.claim_wait = ClaimWait(namespace, seconds, retry)
    return response


@dataclass
class ClaimWait:
    """A claim that found nothing and may wait: its namespace, its wait, and the same claim again (its answer's
    body, None for nothing yet; a refusal raises)."""

    namespace: str
    seconds: float
    retry: Callable[[], dict[str, Any] | None]


def serving_asgi() -> bool:
    return os.environ.get("CONTROLPLANE_SERVER") == "asgi"


@dataclass(eq=False)
class _Waiter:
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future = field(repr=False)

    def wake(self) -> bool:
        if self.future.done():
            return False
        self.loop.call_soon_threadsafe(_resolve, self.future)
        return True


@dataclass(eq=False)
class _ThreadWaiter:
    event: threading.Event = field(default_factory=threading.Event)

    def wake(self) -> bool:
        if self.event.is_set():
            return False
        self.event.set()
        return True


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


class Hub:
    """This process's waiters by namespace, and the one listener thread that wakes them."""

    def __init__(self) -> None:
        self._waiters: dict[str, deque[_Waiter | _ThreadWaiter]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.listening = threading.Event()
        self.woken = (
            0  # waiters woken by notifications since the process started (the herd bound is tested on it)
        )
        # When each namespace was last notified, and when everything was (a fence, a resume, a reconnect) — on the
        # monotonic clock. A waiter that marked the time before its last claim attempt does not wait when a
        # notification came since: it arrived while the waiter was trying, not waiting, and woke nobody.
        self._notified: dict[str, float] = {}
        self._notified_all = float("-inf")

    def waiting(self) -> int:
        with self._lock:
            return sum(len(q) for q in self._waiters.values())

    def _ensure_listener(self, settings_dict: dict[str, Any]) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(
                target=self._listen, args=(settings_dict,), name="claims-listener", daemon=True
            )
            self._thread.start()

    def _listen(self, settings_dict: dict[str, Any]) -> None:
        import psycopg

        params = {
            "dbname": settings_dict["NAME"],
            "user": settings_dict.get("USER") or None,
            "password": settings_dict.get("PASSWORD") or None,
            "host": settings_dict.get("HOST") or None,
            "port": settings_dict.get("PORT") or None,
        }
        quiet = False
        while True:
            try:
                with psycopg.connect(
                    **{k: v for k, v in params.items() if v},
                    autocommit=True,
                    application_name="claims-listener",
                ) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    self.listening.set()
                    quiet = False
                    self.wake(None, None)  # whatever was sent while we were not listening
                    for note in conn.notifies():
                        count, _, namespace = note.payload.partition(" ")
                        self.wake(namespace, int(count) if count.isdigit() else None)
            except Exception as exc:  # noqa: BLE001 - the listener outlives any one connection
                if not quiet:  # once per outage, not every half second
                    log.warning("claim listener lost its connection (%s); reconnecting", exc)
                quiet = True
            self.listening.clear()
            time.sleep(POLL_SECONDS)

    def wake(self, namespace: str | None, count: int | None) -> int:
        """Wake up to ``count`` waiters of ``namespace`` (all of them for None), oldest first."""
        woken = 0
        with self._lock:
            stamp = time.monotonic()
            if namespace is None:
                self._notified_all = stamp
            else:
                self._notified[namespace] = stamp
            queues = (
                list(self._waiters.values()) if namespace is None else [self._waiters.get(namespace, deque())]
            )
            for queue in queues:
                while queue and (count is None or woken < count):
                    if queue.popleft().wake():
                        woken += 1
            self.woken += woken
        return woken

    def _enlist(self, namespace: str, waiter: _Waiter | _ThreadWaiter, since: float) -> bool:
        """Queue ``waiter`` — unless the namespace was notified at or after ``since`` (the waiter's last try began
        then): that notification found it trying, not queued, so it must try again now (False). Checked and queued
        under one lock, so a notification is either seen here or finds the waiter queued."""
        self._ensure_listener(dict(settings.DATABASE_LISTEN or connection.settings_dict))
        with self._lock:
            if max(self._notified.get(namespace, float("-inf")), self._notified_all) >= since:
                return False
            self._waiters.setdefault(namespace, deque()).append(waiter)
            return True

    def _discharge(self, namespace: str, waiter: _Waiter | _ThreadWaiter) -> None:
        with self._lock:
            queue = self._waiters.get(namespace)
            if queue is not None:
                try:
                    queue.remove(waiter)
                except ValueError:
                    pass
                if not queue:
                    self._waiters.pop(namespace, None)

    async def wait(self, namespace: str, timeout: float, *, since: float) -> None:
        """Until a notification wakes this waiter, or ``timeout`` seconds (a coroutine: no thread); at once when one
        came since ``since``."""
        if connection.vendor != "postgresql":
            await asyncio.sleep(min(timeout, POLL_SECONDS))
            return
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop, loop.create_future())
        if not self._enlist(namespace, waiter, since):
            return
        try:
            await asyncio.wait_for(waiter.future, timeout)
        except TimeoutError:
            pass
        finally:
            self._discharge(namespace, waiter)

    def wait_here(self, namespace: str, timeout: float, *, since: float) -> None:
        """The same, blocking the calling thread (WSGI)."""
        if connection.vendor != "postgresql":
            time.sleep(min(timeout, POLL_SECONDS))
            return
        waiter = _ThreadWaiter()
        if not self._enlist(namespace, waiter, since):
            return
        try:
            waiter.event.wait(timeout)
        finally:
            self._discharge(namespace, waiter)


hub = Hub()


def _json(status: int, body: dict[str, Any]) -> HttpResponse:
    return HttpResponse(SafeJSONRenderer().render(body), status=status, content_type="application/json")


def _retry(wait: ClaimWait) -> HttpResponse | None:
    try:
        body = wait.retry()
    except ClaimError as exc:
        answer = exception_handler(exc, {})
        assert answer is not None
        return _json(answer.status_code, dict(answer.data))
    return None if body is None else _json(200, body)


def _until_expiry(namespace: str) -> float | None:
    """Seconds until the namespace's first lease runs out, on the database clock."""
    expiry = selectors.next_lease_expiry(namespace=namespace)
    return None if expiry is None else max(0.0, (expiry - clock.now()).total_seconds())


async def _until_claimable(request: Any, wait: ClaimWait, tried_at: float) -> HttpResponse | None:
    """``tried_at``: when the last claim attempt began (``time.monotonic()``, taken before its transaction)."""
    deadline = time.monotonic() + wait.seconds
    while (left := deadline - time.monotonic()) > 0:
        expiry = await _run(request, _until_expiry, wait.namespace)
        if expiry is not None:
            left = min(left, max(expiry + 0.01, 0.05))
        interleave.reach("claim_wait.found_nothing")
        await hub.wait(wait.namespace, left, since=tried_at)
        tried_at = time.monotonic()
        answer = await _run(request, _retry, wait)
        if answer is not None:
            return answer
    return None


def _tidy_connections() -> None:
    """An executor thread keeps its connection from request to request (the executor is small and bounded, so the
    pool is never drained by it); one that failed is closed here, and the next request in the thread opens another."""
    for conn in connections.all(initialized_only=True):
        if conn.errors_occurred:
            if conn.is_usable():
                conn.errors_occurred = False
            else:
                conn.close()


def _in_executor(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run in the shared executor's threads (the request's own thread never sees it). Under ASGI only:
    under WSGI (runserver, the test client) the request's thread runs it, on the request's connection."""

    def run(*args: Any, **kwargs: Any) -> Any:
        _tidy_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            _tidy_connections()

    return run


async def _run(request: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if isinstance(request, ASGIRequest):
        return await sync_to_async(_in_executor(fn), thread_sensitive=False)(*args, **kwargs)
    return await sync_to_async(fn)(*args, **kwargs)


def offloaded(view: Callable[..., Any]) -> Callable[..., Any]:
    """Under ASGI, a worker endpoint's view as an async view that runs it in the shared executor (a bounded pool of
    threads with their own connections) rather than in a thread started for the request — the hot path pays no
    thread start, and a request never holds a thread it is not using. Under WSGI, the view itself."""
    if not serving_asgi():
        return view

    @functools.wraps(view)
    async def wrapper(request, *args, **kwargs):
        return await _run(request, view, request, *args, **kwargs)

    return wrapper


def _until_claimable_here(wait: ClaimWait, tried_at: float) -> HttpResponse | None:
    deadline = time.monotonic() + wait.seconds
    while (left := deadline - time.monotonic()) > 0:
        expiry = _until_expiry(wait.namespace)
        if expiry is not None:
            left = min(left, max(expiry + 0.01, 0.05))
        interleave.reach("claim_wait.found_nothing")
        hub.wait_here(wait.namespace, left, since=tried_at)
        tried_at = time.monotonic()
        answer = _retry(wait)
        if answer is not None:
            return answer
    return None


def waiting(view: Callable[..., Any]) -> Callable[..., Any]:
    """The view around a claim view that may wait: see the module's docstring."""
    if not serving_asgi():

        @functools.wraps(view)
        def waits_here(request, *args, **kwargs):
            tried_at = time.monotonic()
            response = view(request, *args, **kwargs)
            wait = getattr(response, "claim_wait", None)
            if wait is None:
                return response
            return _until_claimable_here(wait, tried_at) or response

        return waits_here

    @functools.wraps(view)
    async def wrapper(request, *args, **kwargs):
        tried_at = time.monotonic()
        response = await _run(request, view, request, *args, **kwargs)
        wait = getattr(response, "claim_wait", None)
        if wait is None:
            return response
        return await _until_claimable(request, wait, tried_at) or response

    return wrapper
