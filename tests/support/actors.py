"""Named actors and the controllable clock (a pytest plugin, loaded by tests/conftest.py).

``worker_a``, ``worker_b`` … are workers with their own tokens and API clients; ``operator`` and ``oncall``
likewise. Each actor offers the contract's calls, returning the HTTP response, so a test reads like the
contract: ``worker_a.claim(task)``, ``worker_b.commit(task, claim, result)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from rest_framework.test import APIClient

from claims import clock
from claims.digest import digest
from claims.models import Namespace
from claims.services import token_issue


class Clock:
    """The controllable clock: moves the database clock's reading forward, no sleeping."""

    def travel(self, seconds: float) -> None:
        clock.travel(seconds)

    def now(self):
        return clock.now()


@pytest.fixture
def db_clock() -> Clock:
    return Clock()


@dataclass
class Actor:
    name: str
    role: str
    token: str
    client: APIClient

    def post(self, path: str, body: Any = None):
        return self.client.post(f"/api/v1{path}", body if body is not None else {}, format="json")

    def get(self, path: str, **params):
        return self.client.get(f"/api/v1{path}", params)

    # --- the contract's calls, with defaults a well-behaved worker would send ---
    def create(self, node_id: str = "node", input: Any = None, **fields):
        return self.post(
            "/tasks", {"node_id": node_id, "input": input if input is not None else {"n": 1}, **fields}
        )

    def claim(self, task_id: str, *, epoch: int = 1, ttl: int = 30, **fields):
        body = {"owner_id": self.name, "scheduler_epoch": epoch, "ttl_seconds": ttl, **fields}
        return self.post(f"/tasks/{task_id}/claim", body)

    def claim_next(self, *, epoch: int = 1, ttl: int = 30, **fields):
        return self.post(
            "/claims", {"owner_id": self.name, "scheduler_epoch": epoch, "ttl_seconds": ttl, **fields}
        )

    def renew(self, claim: dict, *, extend: int = 30, **override):
        body = {
            "attempt_id": claim["attempt_id"],
            "claim_generation": claim["claim_generation"],
            "owner_id": self.name,
            "scheduler_epoch": claim["scheduler_epoch"],
            "cancel_generation": claim["cancel_generation"],
            "extend_seconds": extend,
            **override,
        }
        return self.post(f"/tasks/{claim['task_id']}/renew", body)

    def release(self, claim: dict, **override):
        body = {
            "attempt_id": claim["attempt_id"],
            "claim_generation": claim["claim_generation"],
            "owner_id": self.name,
            "scheduler_epoch": claim["scheduler_epoch"],
            **override,
        }
        return self.post(f"/tasks/{claim['task_id']}/release", body)

    def stage(self, claim: dict, result: Any, **override):
        body = {
            "attempt_id": claim["attempt_id"],
            "claim_generation": claim["claim_generation"],
            "result": result,
            "result_digest": digest(result),
            **override,
        }
        return self.post(f"/tasks/{claim['task_id']}/results", body)

    def commit_body(self, claim: dict, result: Any, *, inline: bool = False, **override) -> dict:
        body = {
            "attempt_id": claim["attempt_id"],
            "scheduler_epoch": claim["scheduler_epoch"],
            "claim_generation": claim["claim_generation"],
            "observed_cancel_generation": claim["cancel_generation"],
            "input_digest": claim["input_digest"],
            "result_digest": digest(result),
            **({"result": result} if inline else {}),
            **override,
        }
        return body

    def commit_inline(self, claim: dict, result: Any, **override):
        """claim-v1.md §9: the result in the commit itself."""
        return self.post(
            f"/tasks/{claim['task_id']}/commit", self.commit_body(claim, result, inline=True, **override)
        )

    def claim_batch(self, max_tasks: int, *, epoch: int = 1, ttl: int = 30, **fields):
        return self.post(
            "/claims/batch",
            {
                "owner_id": self.name,
                "scheduler_epoch": epoch,
                "ttl_seconds": ttl,
                "max_tasks": max_tasks,
                **fields,
            },
        )

    def commits(self, items: list[dict]):
        return self.post("/commits", {"commits": items})

    def commit(self, claim: dict, result: Any, **override):
        return self.post(f"/tasks/{claim['task_id']}/commit", self.commit_body(claim, result, **override))

    def prepare(self, claim: dict, slot: str, payload: Any, **override):
        body = {
            "task_id": claim["task_id"],
            "effect_slot": slot,
            "payload_digest": digest(payload),
            "attempt_id": claim["attempt_id"],
            "claim_generation": claim["claim_generation"],
            "scheduler_epoch": claim["scheduler_epoch"],
            "owner_id": self.name,
            **override,
        }
        return self.post("/effects/prepare", body)

    def _attempt(self, claim: dict) -> dict:
        return {
            "attempt_id": claim["attempt_id"],
            "claim_generation": claim["claim_generation"],
            "scheduler_epoch": claim["scheduler_epoch"],
            "owner_id": self.name,
        }

    def outcome(self, claim: dict, effect_id: str, state: str, **override):
        return self.post(
            f"/effects/{effect_id}/outcome", {"state": state, **self._attempt(claim), **override}
        )

    def reconcile(self, claim: dict | None, effect_id: str, observed: str, **override):
        body = {"observed": observed, **(self._attempt(claim) if claim else {}), **override}
        return self.post(f"/effects/{effect_id}/reconcile", body)

    def dispatch(self, claim: dict, effect_id: str, payload: Any, target: str, **override):
        body = {"payload": payload, "target": target, **self._attempt(claim), **override}
        return self.post(f"/effects/{effect_id}/dispatch", body)

    def finish(self, claim: dict, result: Any, **override):
        """Stage then commit: the healthy path."""
        staged = self.stage(claim, result)
        assert staged.status_code == 201, staged.content
        return self.commit(claim, result, **override)


def ensure_default_namespace() -> None:
    """Transactional tests flush every table afterwards, the migration's `default` namespace included; put it
    back as the migration made it."""
    from django.utils import timezone

    now = timezone.now()
    Namespace.objects.get_or_create(name="default", defaults={"created_at": now, "updated_at": now})


def make_actor(name: str, role: str, pool: str = "") -> Actor:
    ensure_default_namespace()
    issued = token_issue(name=name, role=role, pool=pool)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.token}")
    return Actor(name=name, role=role, token=issued.token, client=client)


@pytest.fixture
def worker_a(db) -> Actor:
    return make_actor("worker-a", "worker", "v1")


@pytest.fixture
def worker_b(db) -> Actor:
    return make_actor("worker-b", "worker", "v1")


@pytest.fixture
def worker_c(db) -> Actor:
    return make_actor("worker-c", "worker", "v1")


@pytest.fixture
def operator(db) -> Actor:
    return make_actor("olivia-operator", "operator")


@pytest.fixture
def oncall(db) -> Actor:
    return make_actor("oscar-oncall", "oncall")


@pytest.fixture
def anonymous() -> APIClient:
    return APIClient()


@pytest.fixture
def default_namespace(db) -> Namespace:
    ensure_default_namespace()
    return Namespace.objects.get(name="default")


@pytest.fixture
def ready_task(operator) -> str:
    response = operator.create(node_id="build-parser", input={"source": "grammar.y"})
    assert response.status_code == 201, response.content
    return response.json()["task_id"]
