"""The rate limit shared by every app server through Redis (``CACHE_URL``): two production servers, one budget."""

from __future__ import annotations

import os
import uuid

import httpx
import pytest

from tests.support.actors import make_actor

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _redis() -> str:
    broker = os.environ.get("CELERY_BROKER_URL", "")
    if not broker.startswith("redis://"):
        pytest.skip("needs Redis in CELERY_BROKER_URL; .ci/run sets one")
    return broker.rsplit("/", 1)[0] + "/15"


def _statuses(servers, token: str, count: int) -> list[int]:
    headers = {"Authorization": f"Bearer {token}"}
    return [
        httpx.get(f"{servers[i % 2].url}/api/v1/tasks", headers=headers, timeout=10).status_code
        for i in range(count)
    ]


def test_two_servers_share_one_budget_through_redis(app_servers):
    env = {"CACHE_URL": _redis(), "CACHE_KEY_PREFIX": f"t-{uuid.uuid4().hex}", "API_RATE_LIMIT": "10/hour"}
    servers = [app_servers(**env), app_servers(**env)]
    worker = make_actor("metered", "worker")

    statuses = _statuses(servers, worker.token, 14)

    assert statuses == [200] * 10 + [429] * 4


def test_without_a_shared_cache_each_server_counts_alone(app_servers):
    servers = [app_servers(API_RATE_LIMIT="10/hour"), app_servers(API_RATE_LIMIT="10/hour")]
    worker = make_actor("metered", "worker")

    statuses = _statuses(servers, worker.token, 22)

    assert statuses == [200] * 20 + [429] * 2


def test_an_unreachable_cache_lets_requests_through(app_servers):
    server = app_servers(CACHE_URL="redis://127.0.0.1:1/0", API_RATE_LIMIT="10/hour")
    worker = make_actor("metered", "worker")

    statuses = [
        httpx.get(
            f"{server.url}/api/v1/tasks", headers={"Authorization": f"Bearer {worker.token}"}
        ).status_code
        for _ in range(3)
    ]

    assert statuses == [200, 200, 200]  # served, not a 500, with the limit's cache down
