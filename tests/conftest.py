"""The suite's shared support, as plugins by concern (tests/support/):

- ``actors``: named actors (``worker_a``, ``operator``, …) whose calls read like the contract, and the clock;
- ``races``: competing parties on their own connections, pause points, held row locks, lock-waiter polls;
- ``processes``: real Celery worker processes and the effect target;
- ``rollout``: a namespace's stage as the rollout records it, and its stage history replayed (imported by the
  rollout's tests; not a plugin, so the core's tests run without the rollout app).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.apps import apps

from claims import clock, interleave
from claims.auth import tokens


def _forget_routing_hints() -> None:
    if apps.is_installed("rollout"):
        from rollout.services.routing import forget_hints

        forget_hints()


pytest_plugins = ["tests.support.actors", "tests.support.races", "tests.support.processes"]


@pytest.fixture(autouse=True)
def _reset_clock_and_hooks() -> Iterator[None]:
    clock.reset()
    interleave.clear()
    tokens.clear()  # a database rolled back under a remembered token must not authenticate it
    _forget_routing_hints()
    yield
    clock.reset()
    interleave.clear()
    tokens.clear()
