"""Celery: Redis or RabbitMQ from CELERY_BROKER_URL; the embedded default is kombu's SQLAlchemy transport on a SQLite
file of its own (``var/broker.sqlite3``).

The embedded default used to be kombu's filesystem transport. It crashed a worker on an ordinary afternoon: its
writer creates a message file and then fills it, and a reader that lists the folder in between reads an empty file
(``JSONDecodeError``) — the worker died and an on-call fence stayed pending. The SQLAlchemy transport keeps each
message as a row written in one SQLite transaction, so a reader sees a whole message or none; it needs no service,
and SQLite serialises the server, the worker and beat on one machine. Like every virtual transport it holds a
message it has handed out in the worker's memory: a worker killed mid-job loses that copy, and the jobs that must
not be lost are recorded in the database first (fence requests, dispatch intents, rollbacks) and sent again by beat
(``resend_fences``, ``redeliver_dispatches``, ``advance_rollback``). tests/deploy/test_embedded_broker.py runs it.
"""

from __future__ import annotations

from .base import VAR_DIR
from .env import env_bool, env_str

EMBEDDED_BROKER = f"sqla+sqlite:///{VAR_DIR / 'broker.sqlite3'}"
# A worker polls the table once a second (kombu's default for virtual transports).
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", "") or EMBEDDED_BROKER
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
    "check-serving": {"task": "claims.check_serving", "schedule": 5.0},
    "fold-metrics": {"task": "claims.fold_metrics", "schedule": 15.0},
    "prune-history": {"task": "claims.prune_history", "schedule": 300.0},
    "prune-rollout-history": {"task": "rollout.prune_history", "schedule": 300.0},
    "redeliver-dispatches": {"task": "claims.redeliver_dispatches", "schedule": 30.0},
    "sweep-lost-tool-calls": {"task": "gateway.sweep_lost_calls", "schedule": 30.0},
    "resend-fences": {"task": "oncall.resend_fences", "schedule": 15.0},
    "drain-check": {"task": "rollout.drain_check", "schedule": 15.0},
    "gate-check": {"task": "rollout.gate_check", "schedule": 15.0},
    "compare-shadow": {"task": "rollout.compare_shadow", "schedule": 60.0},
    "advance-rollbacks": {"task": "rollout.advance_rollback", "schedule": 15.0},
    "apply-legacy-writes": {"task": "rollout.apply_legacy_writes", "schedule": 5.0},
    "settle-legacy-decisions": {"task": "rollout.settle_legacy_decisions", "schedule": 10.0},
    "observe-legacy": {"task": "rollout.observe_legacy", "schedule": 2.0},
}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")
