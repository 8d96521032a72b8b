"""Waiting claims (claim-v1.md §9 ``wait_seconds``): woken by PostgreSQL LISTEN/NOTIFY, served without a thread each.

``waiting(view)`` wraps the claim-next and batch views in an async view. The wrapped DRF view runs as always (in a
thread, as Django runs any sync view); when it found nothing and the request may wait, it returns its 204 with a
``ClaimWait`` — the namespace, the ``node_ids`` filter, how long, how to try again and how to give back a grant.
The async view then awaits, on the server's event loop and holding no thread, the first of:

- a notification that suits it (``services.wakeups``: tasks of its nodes became READY — created, released,
  requeued, unblocked —, an attempt freed resource keys that tasks of its nodes list, or a fence or resume changed
  who may claim), handed out by this process's one listener;
- the next lease running out that could give it a task (``selectors.next_lease_expiry``: a lease of its nodes, or
  of an attempt holding a key its READY tasks list), which nobody notifies;
- the end of the wait,

and tries the claim again — its own transaction decides, so a notification is a hint only — authenticating the
request's token again first (a revoked token is refused within ``TOKEN_CACHE_SECONDS``, as any request is).
A notification that arrives while the waiter is trying (not queued) wakes nobody; so a waiter notes when each try
began and does not queue when a notification that suits it came since — it tries again at once. Still nothing:
it waits again until the end; then one last try, and 204.

Targeted, no herd: a notification for ``n`` tasks of some nodes wakes at most ``n`` waiters of the namespace in
each process whose filter admits one of those nodes (oldest first); the others stay queued. A woken waiter that
cannot use its wake-up — its retry is refused, its client has gone, what it was granted had to be given back —
hands it on to the next waiter it suits (``Hub.hand_on``; each waiter once per notification). One that found
nothing does not: the task went to another claim. A fence or resume wakes them all (each then answers
FENCED/CLAIMS_PAUSED or claims). The listener, one PostgreSQL connection per server process, wakes every waiter
when it (re)connects, so a notification sent while it was away only delays.

A client that hangs up gets nothing kept for it. Under ASGI (``controlplane.asgi``, which sets
``CONTROLPLANE_SERVER=asgi`` before the URLs are loaded) the views are async, an idle waiter is a suspended
coroutine and a future, and Django cancels the view when the client disconnects: a waiter cancelled while waiting
leaves the queue (handing on a wake-up it had), one cancelled while its retry runs lets the retry finish and
releases what it granted. Under WSGI (the embedded ``runserver``, gunicorn's sync workers, the test client) the
views stay sync and a wait holds the request's thread on a ``threading.Event``; the waiter looks at its client's
socket every ``GONE_POLL_SECONDS`` and after a grant, and releases the grant when the client has gone — where the
server lets the socket be found (``runserver``, gunicorn); behind any other WSGI server a grant to a gone client
is kept until its lease runs out. On SQLite (the embedded default) there is no listener: a waiter looks again
every 0.5 s.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import close_old_connections, transaction
from django.http import HttpResponse
from rest_framework.exceptions import APIException

from . import clock, interleave, selectors
from .errors import ClaimError, exception_handler
from .renderers import SafeJSONRenderer
from .wakeup_hub import POLL_SECONDS, Wake, hub

__all__ = ["ClaimWait", "POLL_SECONDS", "Wake", "hub", "may_wait", "offloaded", "waiting"]

log = logging.getLogger(__name__)


def may_wait(response: Any, wait: ClaimWait | None) -> Any:
    """Mark a claim view's 204 as one that may wait (``waiting``)."""
    if wait is not None and wait.seconds > 0:
        response.claim_wait = wait
    return response


@dataclass
class ClaimWait:
    """A claim that found nothing and may wait: its namespace and node filter, its wait, the same claim again
    (``retry``: its answer's body, None for nothing yet; it authenticates the request's token again, and a refusal
    raises), and how to give back what a retry granted to a client that has gone (``release``, given the body)."""

    namespace: str
    seconds: float
    retry: Callable[[], dict[str, Any] | None]
    release: Callable[[dict[str, Any]], None]
    nodes: frozenset[str] | None = None


def serving_asgi() -> bool:
    return os.environ.get("CONTROLPLANE_SERVER") == "asgi"


def _json(status: int, body: dict[str, Any]) -> HttpResponse:
    return HttpResponse(SafeJSONRenderer().render(body), status=status, content_type="application/json")


def _retry(wait: ClaimWait) -> tuple[int, dict[str, Any]] | None:
    """The claim again: (200, its body), the refusal's (status, body), or None when nothing is claimable yet."""
    try:
        body = wait.retry()
    except (ClaimError, APIException) as exc:
        answer = exception_handler(exc, {})
        assert answer is not None
        return answer.status_code, dict(answer.data)
    return None if body is None else (200, body)


def _release(wait: ClaimWait, body: dict[str, Any]) -> None:
    """Give back what a retry granted to a client that has gone (each claim of a batch): the tasks are claimable
    again at once, instead of when the leases run out."""
    try:
        wait.release(body)
    except Exception:  # noqa: BLE001 - the lease still bounds it
        log.warning("could not release a claim granted to a client that went away", exc_info=True)


def _until_expiry(namespace: str, nodes: frozenset[str] | None) -> float | None:
    """Seconds until the next lease runs out that could give this waiter a task, on the database clock (one
    read-only transaction)."""
    with transaction.atomic():
        expiry = selectors.next_lease_expiry(namespace=namespace, node_ids=sorted(nodes) if nodes else None)
        return None if expiry is None else max(0.0, (expiry - clock.now()).total_seconds())


def _timer(left: float, expiry: float | None) -> float:
    return left if expiry is None else min(left, max(expiry + 0.01, 0.05))


async def _until_claimable(request: Any, wait: ClaimWait, tried_at: float) -> HttpResponse | None:
    """``tried_at``: when the last claim attempt began (``time.monotonic()``, taken before its transaction)."""
    ticket = object()
    deadline = time.monotonic() + wait.seconds
    while (left := deadline - time.monotonic()) > 0:
        expiry = await _run(request, _until_expiry, wait.namespace, wait.nodes)
        interleave.reach("claim_wait.found_nothing")
        wake = await hub.wait(
            wait.namespace, _timer(left, expiry), since=tried_at, ticket=ticket, nodes=wait.nodes
        )
        tried_at = time.monotonic()
        attempt = asyncio.ensure_future(_run(request, _retry, wait))
        try:
            answer = await asyncio.shield(attempt)
        except asyncio.CancelledError:  # the client went away (Django cancels the view): keep nothing for it
            answer = await attempt
            if answer is not None and answer[0] == 200:
                await _run(request, _release, wait, answer[1])
            hub.hand_on(wake, ticket)
            raise
        if answer is not None:
            if answer[0] != 200:
                hub.hand_on(wake, ticket)
            return _json(*answer)
    return None


def _client_socket(request: Any) -> socket.socket | None:
    """The socket of a WSGI request's client, where the server lets us find it: gunicorn's sync and threaded
    workers (``gunicorn.socket``), and Django's ``runserver`` (``wsgi.input`` is a LimitedStream over the
    connection's buffered reader). None elsewhere (the test client, other servers)."""
    environ = getattr(request, "META", {})
    sock = environ.get("gunicorn.socket")
    if sock is None:
        stream = environ.get("wsgi.input")
        reader = getattr(getattr(stream, "_read", None), "__self__", stream)
        sock = getattr(getattr(reader, "raw", None), "_sock", None)
    return sock if isinstance(sock, socket.socket) else None


def _gone(sock: socket.socket | None) -> bool:
    """Whether the client closed its end: a read that would block means it is still there (it sent its request
    and waits); end of stream or a reset means it is gone."""
    if sock is None:
        return False
    try:
        data = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return False
    except OSError:
        return True
    return data == b""


def _until_claimable_here(request: Any, wait: ClaimWait, tried_at: float) -> HttpResponse | None:
    sock = _client_socket(request)
    ticket = object()
    deadline = time.monotonic() + wait.seconds
    while (left := deadline - time.monotonic()) > 0:
        expiry = _until_expiry(wait.namespace, wait.nodes)
        interleave.reach("claim_wait.found_nothing")
        wake = hub.wait_here(
            wait.namespace,
            _timer(left, expiry),
            since=tried_at,
            ticket=ticket,
            nodes=wait.nodes,
            gone=lambda: _gone(sock),
        )
        if _gone(sock):
            hub.hand_on(wake, ticket)
            return None
        tried_at = time.monotonic()
        answer = _retry(wait)
        if answer is None:
            continue
        status, body = answer
        if status == 200 and _gone(sock):  # it hung up while we claimed: nobody will receive this
            _release(wait, body)
            hub.hand_on(wake, ticket)
            return None
        if status != 200:
            hub.hand_on(wake, ticket)
        return _json(status, body)
    return None


def _tidy_connections() -> None:
    """Before and after each piece of work in an executor thread, what Django does around every request
    (``close_old_connections``): a failed connection is closed; a pooled one goes back to the pool, whose check on
    the way out (``CONN_HEALTH_CHECKS``: psycopg_pool's ``check_connection``) replaces a connection a database
    restart killed — so a restart costs no request beyond those in flight — and a persistent one (no pool) stays
    with the thread, health-checked on its first use."""
    close_old_connections()


def _in_executor(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run in the shared executor's threads (the request's own thread never sees it). Under ASGI only:
    under WSGI (runserver, the test client) the request's thread runs it, on the request's connection."""

    def run(*args: Any, **kwargs: Any) -> Any:
        _tidy_connections()
        try:
            return _rendered(fn(*args, **kwargs))
        finally:
            _tidy_connections()

    return run


def _rendered(response: Any) -> Any:
    """A response that renders late (DRF's) rendered here, in the executor's thread, and handed on as a plain
    HttpResponse. Django's async handler renders every response that still has a ``render`` in a thread of the
    request's own (``sync_to_async(thread_sensitive=True)``): one more thread hand-off per request, ~4 % of a
    server process's time on the batched worker path (docs/benchmarks.md). None of the middleware has a
    ``process_template_response`` to run before it."""
    if not callable(getattr(response, "render", None)):
        return response
    response.render()
    plain = HttpResponse(
        response.content, status=response.status_code, reason=response.reason_phrase, headers=response.headers
    )
    plain.cookies = response.cookies
    for mark in ("claim_wait", "history_changed"):  # what the middleware and the waiting views read off it
        if hasattr(response, mark):
            setattr(plain, mark, getattr(response, mark))
    return plain


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
            return _until_claimable_here(request, wait, tried_at) or response

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
