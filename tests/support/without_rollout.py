"""A pytest plugin that makes the rollout app unimportable, as if it were not installed: ``make test`` runs the
core's, on-call's and the gateway's suites with it (``-p tests.support.without_rollout`` and the ``test_core``
settings, which leave it out of INSTALLED_APPS). Any import of ``rollout`` — by product code or by a test helper —
fails there, so those suites prove that the rollout wraps the core and can be removed (issue 38)."""

from __future__ import annotations

import importlib.abc
import sys

BLOCKED = "rollout"


class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001, ANN201 - the finder protocol
        if fullname == BLOCKED or fullname.startswith(BLOCKED + "."):
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (the rollout app is not installed)", name=fullname
            )
        return None


def _uninstall() -> None:
    for name in [name for name in sys.modules if name == BLOCKED or name.startswith(BLOCKED + ".")]:
        del sys.modules[name]
    if not any(isinstance(finder, _NotInstalled) for finder in sys.meta_path):
        sys.meta_path.insert(0, _NotInstalled())


_uninstall()  # at import: before pytest-django sets Django up
