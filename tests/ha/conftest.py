"""One HA cluster for the tests of this folder (they run one after another, in the serial part of the suite)."""

from __future__ import annotations

import pytest

from tests.support import ha


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    if not ha.can_run():
        pytest.skip("the HA cluster needs root and Debian's PostgreSQL (CI has both)")
    cluster = ha.Cluster(tmp_path_factory.mktemp("ha"), sync=True).up()
    yield cluster
    cluster.down()
