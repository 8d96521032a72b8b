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

from claims import clock, interleave
from claims.auth import tokens

pytest_plugins = ["tests.support.actors", "tests.support.races", "tests.support.processes"]


@pytest.fixture(autouse=True)
def _reset_clock_and_hooks() -> Iterator[None]:
    clock.reset()
    interleave.clear()
    tokens.clear()  # a database rolled back under a remembered token must not authenticate it
    yield
    clock.reset()
    interleave.clear()
    tokens.clear()
