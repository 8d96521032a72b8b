"""Celery: Redis or RabbitMQ from CELERY_BROKER_URL; the embedded default is kombu's filesystem broker."""

from __future__ import annotations

from .base import VAR_DIR
from .env import env_bool, env_str

CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "filesystem://")
if CELERY_BROKER_URL == "filesystem://":
    _queue_dir = VAR_DIR / "broker"
    for _sub in ("out", "processed"):
        (_queue_dir / _sub).mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_queue_dir / "out"),
        "data_folder_out": str(_queue_dir / "out"),
        "data_folder_processed": str(_queue_dir / "processed"),
    }
CELERY_RESULT_BACKEND = env_str("CELERY_RESULT_BACKEND", "") or None
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = "UTC"

# Periodic jobs (celery beat). The embedded default (`make run`) runs a worker with beat next to the server.
CELERY_BEAT_SCHEDULE = {
    "reap-expired-leases": {"task": "claims.reap_expired_leases", "schedule": 10.0},
    "fold-metrics": {"task": "claims.fold_metrics", "schedule": 15.0},
    "prune-history": {"task": "claims.prune_history", "schedule": 300.0},
    "prune-rollout-history": {"task": "rollout.prune_history", "schedule": 300.0},
    "redeliver-dispatches": {"task": "claims.redeliver_dispatches", "schedule": 30.0},
    "resend-fences": {"task": "rollout.resend_fences", "schedule": 15.0},
    "drain-check": {"task": "rollout.drain_check", "schedule": 15.0},
    "gate-check": {"task": "rollout.gate_check", "schedule": 15.0},
    "coverage-check": {"task": "rollout.coverage_check", "schedule": 60.0},
    "compare-shadow": {"task": "rollout.compare_shadow", "schedule": 60.0},
    "advance-rollbacks": {"task": "rollout.advance_rollback", "schedule": 15.0},
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
