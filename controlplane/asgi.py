"""The ASGI application (uvicorn): what serves waiting claims (claim-v1.md §9 ``wait_seconds``) without a thread
each — see docs/deployment.md."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

application = get_asgi_application()
