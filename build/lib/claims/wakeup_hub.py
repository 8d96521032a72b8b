"""The waiting claims' hub (``claims.waiting``): one per server process — its LISTEN connection to PostgreSQL, the
queue of waiters per namespace, and who a notification wakes (targeted: at most ``n`` suitable waiters, oldest first;
a wake-up a waiter cannot use handed on)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import connection

from .services import wakeups
from .services.wakeups import CHANNEL

log = logging.getLogger(__name__)

POLL_SECONDS = 0.5  # SQLite, and the listener's reconnect pause
GONE_POLL_SECONDS = 0.25


def _suits(wanted: frozenset[str] | None, notified: frozenset[str] | None) -> bool:
    """Whether a waiter filtered to ``wanted`` nodes (None: any) may take a task of ``notified`` (None: any)."""
    return wanted is None or notified is None or not wanted.isdisjoint(notified)


@dataclass(eq=False)
class Wake:
    """One notification as this process's waiters see it: the waiters it woke (each request once, by its ticket),
    so that a woken waiter that could not use it hands it on to one it has not woken yet."""

    namespace: str | None
    nodes: frozenset[str] | None
    visited: set[object] = field(default_factory=set)


@dataclass(eq=False)
class _Waiter:
    ticket: object  # the waiting request, the same across its waits
    nodes: frozenset[str] | None
    woken_by: Wake | None = None

    def wake(self, wake: Wake) -> bool:
        raise NotImplementedError


@dataclass(eq=False)
class _AsyncWaiter(_Waiter):
    loop: asyncio.AbstractEventLoop | None = None
    future: asyncio.Future | None = field(default=None, repr=False)

    def wake(self, wake: Wake) -> bool:
        assert self.loop is not None and self.future is not None
        if self.future.done() or self.woken_by is not None:
            return False
        self.woken_by = wake
        self.loop.call_soon_threadsafe(_resolve, self.future)
        return True


@dataclass(eq=False)
class _ThreadWaiter(_Waiter):
    event: threading.Event = field(default_factory=threading.Event)

    def wake(self, wake: Wake) -> bool:
        if self.event.is_set() or self.woken_by is not None:
            return False
        self.woken_by = wake
        self.event.set()
        return True


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


_RECENT = 64  # notifications remembered per namespace, for waiters that were trying when one came


class Hub:
    """This process's waiters by namespace, and the one listener thread that wakes them."""

    def __init__(self) -> None:
        self._waiters: dict[str, deque[_Waiter]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.listening = threading.Event()
        self.woken = (
            0  # waiters woken by notifications since the process started (the herd bound is tested on it)
        )
        self.handed_on = 0  # waiters woken by a wake-up another waiter could not use
        # Each namespace's last notifications (when, on the monotonic clock, and for which nodes), and when
        # everything was notified (a fence, a resume, a reconnect). A waiter that marked the time before its last
        # claim attempt does not wait when a notification that suits it came since: it arrived while the waiter
        # was trying, not waiting, and woke nobody.
        self._recent: dict[str, deque[tuple[float, frozenset[str] | None]]] = {}
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
                        try:
                            namespace, count, nodes = wakeups.parse(note.payload)
                        except (ValueError, KeyError, TypeError):
                            log.warning("unreadable claim notification %r", note.payload[:200])
                            continue
                        self.wake(namespace, count, nodes)
            except Exception as exc:  # noqa: BLE001 - the listener outlives any one connection
                if not quiet:  # once per outage, not every half second
                    log.warning("claim listener lost its connection (%s); reconnecting", exc)
                quiet = True
            self.listening.clear()
            time.sleep(POLL_SECONDS)

    def wake(self, namespace: str | None, count: int | None, nodes: frozenset[str] | None = None) -> int:
        """Wake up to ``count`` waiters of ``namespace`` (every waiter of every namespace for None) that a task of
        ``nodes`` suits (None: any node), oldest first; the others stay queued."""
        with self._lock:
            stamp = time.monotonic()
            if namespace is None:
                self._notified_all = stamp
            else:
                self._recent.setdefault(namespace, deque(maxlen=_RECENT)).append((stamp, nodes))
            wake = Wake(namespace, nodes)
            queues: list[deque[_Waiter] | None] = (
                list(self._waiters.values()) if namespace is None else [self._waiters.get(namespace)]
            )
            woken = sum(self._wake_in(queue, wake, count) for queue in queues if queue)
            self.woken += woken
        return woken

    def _wake_in(self, queue: deque[_Waiter], wake: Wake, count: int | None) -> int:
        woken = 0
        for waiter in list(queue):
            if count is not None and woken >= count:
                break
            if waiter.ticket in wake.visited or not _suits(waiter.nodes, wake.nodes):
                continue
            queue.remove(waiter)
            if waiter.wake(wake):
                wake.visited.add(waiter.ticket)
                woken += 1
        return woken

    def hand_on(self, wake: Wake | None, ticket: object) -> int:
        """The waiter ``ticket`` was woken by ``wake`` and could not use it — its retry was refused, its client is
        gone, what it was granted was given back: wake one more waiter the notification suits that it has not woken
        yet. (A retry that found nothing does not hand on: the task went to another claim.)"""
        if wake is None or wake.namespace is None:  # nothing, or a wake-up every waiter already had
            return 0
        with self._lock:
            wake.visited.add(ticket)
            queue = self._waiters.get(wake.namespace)
            woken = self._wake_in(queue, wake, 1) if queue else 0
            self.handed_on += woken
        return woken

    def _missed(self, namespace: str, nodes: frozenset[str] | None, since: float) -> bool:
        """Whether a notification that suits a waiter of ``nodes`` came at or after ``since`` (under the lock)."""
        if self._notified_all >= since:
            return True
        recent = self._recent.get(namespace)
        if not recent:
            return False
        if len(recent) == recent.maxlen and recent[0][0] >= since:
            return True  # older ones were forgotten: assume one suited
        for stamp, notified in reversed(recent):
            if stamp < since:
                return False
            if _suits(nodes, notified):
                return True
        return False

    def _enlist(self, namespace: str, waiter: _Waiter, since: float) -> bool:
        """Queue ``waiter`` — unless a notification that suits it came at or after ``since`` (the waiter's last try
        began then): that notification found it trying, not queued, so it must try again now (False). Checked and
        queued under one lock, so a notification is either seen here or finds the waiter queued."""
        self._ensure_listener(dict(settings.DATABASE_LISTEN or connection.settings_dict))
        with self._lock:
            if self._missed(namespace, waiter.nodes, since):
                return False
            self._waiters.setdefault(namespace, deque()).append(waiter)
            return True

    def _discharge(self, namespace: str, waiter: _Waiter) -> None:
        with self._lock:
            queue = self._waiters.get(namespace)
            if queue is not None:
                try:
                    queue.remove(waiter)
                except ValueError:
                    pass
                if not queue:
                    self._waiters.pop(namespace, None)

    async def wait(
        self, namespace: str, timeout: float, *, since: float, ticket: object, nodes: frozenset[str] | None
    ) -> Wake | None:
        """Until a notification that suits the waiter wakes it (returned), or ``timeout`` seconds (a coroutine: no
        thread); at once when one came since ``since``. Cancelled (the client went away) after a wake-up, it hands
        the wake-up on."""
        if connection.vendor != "postgresql":
            await asyncio.sleep(min(timeout, POLL_SECONDS))
            return None
        loop = asyncio.get_running_loop()
        waiter = _AsyncWaiter(ticket, nodes, loop=loop, future=loop.create_future())
        if not self._enlist(namespace, waiter, since):
            return None
        try:
            assert waiter.future is not None
            await asyncio.wait_for(waiter.future, timeout)
        except TimeoutError:
            pass
        except asyncio.CancelledError:  # the client went away: a wake-up it had goes to the next waiter
            self.hand_on(waiter.woken_by, ticket)  # (never to itself: its ticket is marked visited)
            raise
        finally:
            self._discharge(namespace, waiter)
        return waiter.woken_by

    def wait_here(
        self,
        namespace: str,
        timeout: float,
        *,
        since: float,
        ticket: object,
        nodes: frozenset[str] | None,
        gone: Callable[[], bool] = lambda: False,
    ) -> Wake | None:
        """The same, blocking the calling thread (WSGI); it also returns, without a wake-up, once ``gone()`` says
        the client hung up (looked at every ``GONE_POLL_SECONDS``, no database work)."""
        if connection.vendor != "postgresql":
            time.sleep(min(timeout, POLL_SECONDS))
            return None
        waiter = _ThreadWaiter(ticket, nodes)
        if not self._enlist(namespace, waiter, since):
            return None
        deadline = time.monotonic() + timeout
        try:
            while (left := deadline - time.monotonic()) > 0:
                if waiter.event.wait(min(left, GONE_POLL_SECONDS)) or gone():
                    break
        finally:
            self._discharge(namespace, waiter)
        return waiter.woken_by


hub = Hub()
