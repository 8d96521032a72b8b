"""Named pause points inside service transactions, for the controlled-interleaving acceptance tests.

A service calls ``reach("task_commit.checked")`` at a point where a race matters; in production no hook is
installed and the call is one dictionary lookup. A test installs a hook that blocks the thread there — holding
whatever locks the transaction holds — until the competing transition has run (acceptance.md: "pause a worker
after reading, after checking authority …; resume it only after the competing transition has committed").
"""

from __future__ import annotations

from collections.abc import Callable

_hooks: dict[str, Callable[[], None]] = {}


def reach(point: str) -> None:
    hook = _hooks.get(point)
    if hook is not None:
        hook()


def install(point: str, hook: Callable[[], None]) -> None:
    _hooks[point] = hook


def clear() -> None:
    _hooks.clear()
