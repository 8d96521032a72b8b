"""gunicorn for the control plane: uvicorn workers serving the ASGI application, so a claim waiting for work
(claim-v1.md §9 ``wait_seconds``) is a suspended coroutine, not a thread (claims/waiting.py). Sync views — every
other request — run in a thread of Django's per-request executor with pooled database connections
(``DATABASE_POOL=true``). ``claimctl serve`` runs it (shipped in the package, so it runs outside a checkout too):

    claimctl serve            # = gunicorn -c <this file> controlplane.asgi:application
"""

import os

bind = os.environ.get("BIND") or f"{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '8000')}"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
worker_class = "uvicorn_worker.UvicornWorker"
# A waiting claim holds its connection up to 30 s (claim-v1.md §9): keep-alive and the timeout must outlast it.
timeout = 60
graceful_timeout = 35
keepalive = 40
accesslog = os.environ.get("ACCESS_LOG") or None
