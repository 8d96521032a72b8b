"""The core's suite runs a second time in ``make test`` with the rollout app unimportable
(tests/support/without_rollout.py): this checks that, in that run, it really is."""

from __future__ import annotations

import importlib
import sys

import pytest
from django.conf import settings

pytestmark = pytest.mark.skipif(
    "tests.support.without_rollout" not in sys.modules, reason="runs in the core-only run of make test"
)


def test_the_rollout_app_is_neither_installed_nor_importable():
    assert "rollout" not in settings.INSTALLED_APPS
    assert not [name for name in sys.modules if name == "rollout" or name.startswith("rollout.")]
    with pytest.raises(ModuleNotFoundError, match="not installed"):
        importlib.import_module("rollout.services")
