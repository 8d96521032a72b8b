"""The middleware, lean for the REST API and thread-free under ASGI.

Every ``/api/`` call authenticates with a bearer token (``claims.auth``) and answers JSON: it has no session, no
cookie to protect from CSRF, no logged-in Django user and no flash messages. The console-only subclasses of Django's
own middleware (so Django's checks still find them) hand an API request straight on and do their work for the
console, the login page and the admin only.

Under ASGI (deploy/gunicorn.conf.py) Django runs a sync-only middleware — or a sync ``process_request`` of an
async-capable one — in a thread of the request's own; a claim waiting for work would then keep that thread for its
whole wait. ``Security``, ``Common`` and ``XFrameOptions`` do pure computation on the request and response, so their
async path here calls them inline; ``StaticFiles`` (WhiteNoise, sync-only upstream) looks a static file up in the
shared executor and otherwise passes the request on without a thread.
"""

from __future__ import annotations

import time

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.contrib.auth.middleware import AuthenticationMiddleware as _Authentication
from django.contrib.messages.middleware import MessageMiddleware as _Messages
from django.contrib.sessions.middleware import SessionMiddleware as _Sessions
from django.db import connection
from django.http import HttpResponse, JsonResponse
from django.middleware.clickjacking import XFrameOptionsMiddleware as _XFrameOptions
from django.middleware.common import CommonMiddleware as _Common
from django.middleware.csrf import CsrfViewMiddleware as _Csrf
from django.middleware.security import SecurityMiddleware as _Security
from prometheus_client import Histogram
from whitenoise.middleware import WhiteNoiseMiddleware as _WhiteNoise

from claims.errors import database_unavailable, history_changed
from claims.services.serving import serving_check

API_PREFIX = "/api/"


class _Inline:
    """Async path without a thread, for middleware whose hooks neither block nor touch the database."""

    async def __acall__(self, request):
        response = None
        if hasattr(self, "process_request"):
            response = self.process_request(request)
        response = response or await self.get_response(request)  # type: ignore[attr-defined]
        if hasattr(self, "process_response"):
            response = self.process_response(request, response)
        return response


class SecurityMiddleware(_Inline, _Security):
    pass


class CommonMiddleware(_Inline, _Common):
    pass


class XFrameOptionsMiddleware(_Inline, _XFrameOptions):
    pass


class _BothModes:
    """A middleware that runs in the server's mode: its own ``__acall__`` under ASGI, no thread."""

    sync_capable = True
    async_capable = True

    def _take_mode(self, get_response) -> None:
        self.async_mode = iscoroutinefunction(get_response)
        if self.async_mode:
            markcoroutinefunction(self)


class _Around(_BothModes):
    """A middleware around the rest of the chain: ``_sync`` in a WSGI server, ``__acall__`` under ASGI."""

    def __init__(self, get_response):
        self.get_response = get_response
        self._take_mode(get_response)

    def __call__(self, request):
        if self.async_mode:
            return self.__acall__(request)
        return self._sync(request)


class StaticFiles(_BothModes, _WhiteNoise):
    def __init__(self, get_response=None):
        super().__init__(get_response)
        self._take_mode(get_response)

    def __call__(self, request):
        if self.async_mode:
            return self.__acall__(request)
        return super().__call__(request)

    def _static(self, request):
        static_file = (
            self.find_file(request.path_info) if self.autorefresh else self.files.get(request.path_info)
        )
        return None if static_file is None else self.serve(static_file, request)

    async def __acall__(self, request):
        if not request.path_info.startswith(API_PREFIX):
            found = await sync_to_async(self._static, thread_sensitive=False)(request)
            if found is not None:
                return found
        return await self.get_response(request)


class _ConsoleOnly:
    get_response: object

    def __call__(self, request):
        if request.path_info.startswith(API_PREFIX):
            return self.get_response(request)  # type: ignore[operator]
        return super().__call__(request)  # type: ignore[misc]


class SessionMiddleware(_ConsoleOnly, _Sessions):
    pass


class AuthenticationMiddleware(_ConsoleOnly, _Authentication):
    pass


class MessageMiddleware(_ConsoleOnly, _Messages):
    pass


class CsrfViewMiddleware(_ConsoleOnly, _Csrf):
    def __init__(self, get_response):
        super().__init__(get_response)
        if self.async_mode:
            # Django adapts a sync process_view to a thread of the request's own; an API request must not take one.
            self.process_view = self._process_view_async  # type: ignore[method-assign]

    def process_view(self, request, callback, callback_args, callback_kwargs):
        if request.path_info.startswith(API_PREFIX):
            return None
        return super().process_view(request, callback, callback_args, callback_kwargs)

    async def _process_view_async(self, request, callback, callback_args, callback_kwargs):
        if request.path_info.startswith(API_PREFIX):
            return None
        return await sync_to_async(super().process_view)(request, callback, callback_args, callback_kwargs)


class RequestLatency(_Around):
    """``claims_http_request_duration_seconds{route, method, status}``: each request's time in this process, by
    its URL pattern (not its path: one series per route, whatever the ids), on /metrics. Thread-free under ASGI;
    the histogram is this process's own (prometheus_client's registry), so behind one port shared by several
    server processes a scrape sees the process that answered it (docs/deployment.md, "Metrics")."""

    def _sync(self, request):
        started = time.perf_counter()
        response = self.get_response(request)
        _observe(request, response, time.perf_counter() - started)
        return response

    async def __acall__(self, request):
        started = time.perf_counter()
        response = await self.get_response(request)
        _observe(request, response, time.perf_counter() - started)
        return response


class DatabaseFailover(_Around):
    """A database that cannot decide now is a 503 with Retry-After at every door, never a 500 (issue 39): the
    API's answers are shaped by ``claims.errors.exception_handler``; the console's and the admin's here
    (``process_exception``). When the answer is that the database's history changed under the control plane — a
    failover — the server records the new history, and fences if it must, before the answer leaves
    (``claims.services.serving.serving_check``), so the client's retry is decided on the checked history."""

    def _sync(self, request):
        response = self.get_response(request)
        if getattr(response, "history_changed", False):
            serving_check()
        return response

    async def __acall__(self, request):
        response = await self.get_response(request)
        if getattr(response, "history_changed", False):
            await sync_to_async(_check_on_own_connection, thread_sensitive=False)()
        return response

    def process_exception(self, request, exc):
        why = database_unavailable(exc)
        if why is None:
            return None
        if request.path.startswith(API_PREFIX):
            response = JsonResponse({"outcome": "UNAVAILABLE", "detail": why}, status=503)
        else:
            response = HttpResponse(f"Service unavailable: {why}.", status=503, content_type="text/plain")
        response["Retry-After"] = "1"
        response.history_changed = history_changed(exc)
        return response


def _check_on_own_connection() -> None:
    """``serving_check`` on a connection opened for it: after a failover, a thread's older connection may still
    point at the node that died."""
    try:
        serving_check()
    finally:
        connection.close()


def _observe(request, response, seconds: float) -> None:
    match = getattr(request, "resolver_match", None)
    route = ("/" + match.route) if match is not None and match.route else "unmatched"
    LATENCY.labels(route=route, method=request.method, status=str(response.status_code)).observe(seconds)


LATENCY = Histogram(
    "claims_http_request_duration_seconds",
    "Time to answer a request in this server process, by URL pattern, method and status.",
    ["route", "method", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 35),
)
