"""The ASGI application (uvicorn workers under gunicorn, deploy/gunicorn.conf.py): what serves waiting claims
(claim-v1.md §9 ``wait_seconds``) without a thread each.

Django's ASGI handler runs the ``request_started`` receivers that are sync (``close_old_connections``,
``reset_queries``) in a thread started for the request, which would then sit parked beside every waiting claim for
its whole wait. Here they run for the console and admin only: the API's worker endpoints take and return their
database connections in the shared executor's threads (``claims.waiting``), and the API's other views run in the
request's thread on a connection from the pool, returned when the response closes (``request_finished``, as
Django does)."""

from __future__ import annotations

import os

from asgiref.sync import sync_to_async
from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
# Read by claims.waiting when the URLs load: the worker endpoints become async views (sync ones under WSGI).
os.environ["CONTROLPLANE_SERVER"] = "asgi"

application = get_asgi_application()

from django.core import signals  # noqa: E402  (after setup)
from django.db import close_old_connections, reset_queries  # noqa: E402


def _started(**kwargs) -> None:
    reset_queries(**kwargs)
    close_old_connections(**kwargs)


async def _request_started(sender, scope=None, **kwargs) -> None:
    if scope is not None and scope.get("path", "").startswith("/api/"):
        return
    await sync_to_async(_started)(**kwargs)


signals.request_started.disconnect(reset_queries)
signals.request_started.disconnect(close_old_connections)
signals.request_started.connect(_request_started)
