"""Health probes for load balancers and orchestrators (docs/deployment.md).

``GET /healthz`` — the process is up and serving: answers without touching the database or the broker, so a slow
database never gets healthy app servers restarted. ``GET /readyz`` — this process can do its work: the database
answers, every migration this code knows is applied, and the Celery broker accepts a connection; 503 naming what
failed otherwise, so the load balancer sends no traffic here until it is ready. Both are unauthenticated, read
nothing but those answers, write nothing, and are exempt from the HTTPS redirect (a balancer probes backends over
plain HTTP)."""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse, HttpResponsePermanentRedirect, JsonResponse
from django.templatetags.static import static
from django.views.decorators.http import require_safe

from . import __version__

logger = logging.getLogger(__name__)

_migrated = False  # once every migration is applied it stays so for this process's code


@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    checks = {"database": _database(), "migrations": "unknown", "broker": _broker()}
    if checks["database"] == "ok":
        checks["migrations"] = _migrations()
    ready = all(value in ("ok", "eager") for value in checks.values())
    if not ready:
        logger.warning("not ready: %s", checks)
    body = {"status": "ready" if ready else "not ready", "version": __version__, "checks": checks}
    return JsonResponse(body, status=200 if ready else 503)


def _database() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        logger.warning("readyz: database: %s", exc)
        return "unreachable"
    return "ok"


def _migrations() -> str:
    global _migrated
    if _migrated:
        return "ok"
    from django.db.migrations.executor import MigrationExecutor

    try:
        executor = MigrationExecutor(connection)
        pending = executor.migration_plan(executor.loader.graph.leaf_nodes())
    except DatabaseError as exc:
        logger.warning("readyz: migrations: %s", exc)
        return "unreachable"
    if pending:
        return f"{len(pending)} pending"
    _migrated = True
    return "ok"


def _broker() -> str:
    if settings.CELERY_TASK_ALWAYS_EAGER:
        return "eager"  # jobs run in the request's process: there is no broker to reach
    from controlplane.celery import app

    connection_: Any = app.connection_for_write(url=settings.CELERY_BROKER_URL, connect_timeout=2)
    try:
        connection_.ensure_connection(max_retries=1, timeout=2)
        connection_.default_channel  # noqa: B018 - opening a channel is what proves the broker answers
    except Exception as exc:  # noqa: BLE001 - any failure to reach the broker is "unreachable"
        logger.warning("readyz: broker: %s: %s", type(exc).__name__, exc)
        return "unreachable"
    finally:
        connection_.release()
    return "ok"


def favicon(request: HttpRequest) -> HttpResponse:
    """Browsers ask for /favicon.ico whatever the page says: the console's icon (its static file)."""
    return HttpResponsePermanentRedirect(static("console/favicon.svg"))
