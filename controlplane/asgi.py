"""The ASGI application (uvicorn workers under gunicorn, deploy/gunicorn.conf.py): what serves waiting claims
(claim-v1.md §9 ``wait_seconds``) without a thread each, and the MCP tool gateway (``gateway.mcp``, docs/mcp.md)
under ``/mcp`` beside Django. The lifespan runs the gateway's parts — the MCP SDK's session manager and the
downstream connections — for the life of the process.

Django's ASGI handler runs the ``request_started`` receivers that are sync (``close_old_connections``,
``reset_queries``) in the request's thread, which would then sit parked beside every waiting claim for its whole
wait. Here they are not receivers (a signal with none costs nothing to send): ``django_served`` runs them for the
console and admin only. The API's worker endpoints take and return their database connections in the shared
executor's threads (``claims.waiting``), and the API's other views run in the request's thread on a connection
from the pool, returned when the response closes (``request_finished``, as Django does). Each request's own thread
for Django's thread-sensitive work is lent, not started (``controlplane.request_threads``)."""

from __future__ import annotations

import os

from asgiref.sync import sync_to_async
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
# Read by claims.waiting when the URLs load: the worker endpoints become async views (sync ones under WSGI).
os.environ["CONTROLPLANE_SERVER"] = "asgi"

django_application = get_asgi_application()

from django.core import signals  # noqa: E402  (after setup)
from django.db import close_old_connections, reset_queries  # noqa: E402


def _started(**kwargs) -> None:
    reset_queries(**kwargs)
    close_old_connections(**kwargs)


signals.request_started.disconnect(reset_queries)
signals.request_started.disconnect(close_old_connections)


from django.apps import apps  # noqa: E402

from .request_threads import request_thread  # noqa: E402


async def django_served(scope, receive, send) -> None:
    """Django's handler, each request's thread-sensitive work on a thread lent to it (controlplane/
    request_threads.py) instead of one started and joined for it."""
    async with request_thread():
        if scope["type"] == "http" and not scope["path"].startswith("/api/"):
            await sync_to_async(_started)()
        await django_application(scope, receive, send)


def _mcp_path(path: str) -> bool:
    return path == "/mcp" or path.startswith("/mcp/")


async def _lifespan(receive, send, running) -> None:
    await receive()  # lifespan.startup
    started = False
    try:
        async with running():
            await send({"type": "lifespan.startup.complete"})
            started = True
            await receive()  # lifespan.shutdown
    except Exception as exc:  # a failed start stops the server with the reason
        if not started:
            await send({"type": "lifespan.startup.failed", "message": f"{type(exc).__name__}: {exc}"})
            return
        raise
    await send({"type": "lifespan.shutdown.complete"})


if apps.is_installed("gateway"):
    from gateway.mcp import gateway

    async def application(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send, gateway.running)
        elif scope["type"] == "http" and _mcp_path(scope["path"]):
            await gateway(scope, receive, send)
        else:
            await django_served(scope, receive, send)

else:
    application = django_served
