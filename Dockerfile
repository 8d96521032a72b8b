# The control plane's production image: `pip install .` — the package (its three apps with their templates, static
# files and migrations), its pinned dependencies and the `claimctl` command. One image runs every role; the command
# picks it:
#   server:  claimctl serve     (the default: gunicorn + uvicorn workers, the package's own config)
#   worker:  claimctl worker
#   beat:    claimctl beat --schedule /tmp/celerybeat-schedule   (exactly one)
#   migrate: claimctl migrate --no-input
# Configuration is the environment (docs/deployment.md, deploy/production.env.example).
# Not built on the machines this project is developed on (no Docker engine there): docs/deployment.md says what
# checked it.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    CONTROLPLANE_VAR_DIR=/var/lib/controlplane BIND=0.0.0.0:8000 WEB_CONCURRENCY=2 DATABASE_POOL=true

WORKDIR /src
COPY pyproject.toml README.md ./
COPY claims ./claims
COPY oncall ./oncall
COPY rollout ./rollout
COPY gateway ./gateway
COPY controlplane ./controlplane
# Static files are served by WhiteNoise from the apps' own folders (WHITENOISE_USE_FINDERS): no collectstatic.
RUN pip install --no-cache-dir . \
    && useradd --system --home-dir /var/lib/controlplane --create-home controlplane \
    && rm -rf /src

WORKDIR /var/lib/controlplane
USER controlplane
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s CMD python -c "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz').status != 200)"
CMD ["claimctl", "serve"]
