"""gunicorn's settings for the control plane live in the package (``controlplane/gunicorn_conf.py``, which
``claimctl serve`` uses); this file keeps ``gunicorn -c deploy/gunicorn.conf.py controlplane.asgi:application``
working from a checkout."""

from controlplane.gunicorn_conf import *  # noqa: F403
