"""The rollout tests' shared fixtures: a team's own legacy database and the adapter over its table
(tests/support/legacy_db.py)."""

from __future__ import annotations

import pytest

from rollout.legacy_table import TableLegacyStore, TableMapping
from tests.support.legacy_db import ALIASES, MAPPING, Their, their_table_configured


@pytest.fixture(params=ALIASES)
def their(request):
    db = Their(request.param)
    db.create_jobs()
    db.sql(
        "INSERT INTO jobs (job_id, queue, payload) VALUES ('j1', 'default', 'p1'), ('j2', 'default', 'p2'), "
        "('j3', 'other', 'p3')"
    )
    yield db
    db.sql("DROP TABLE IF EXISTS jobs")


@pytest.fixture
def jobs(their):
    """The adapter over the team's table: its own names, a column it must never touch (payload), three jobs."""
    return TableLegacyStore(TableMapping(**MAPPING, database=their.alias))


@pytest.fixture
def table_store(their):
    with their_table_configured(their.alias):
        yield their
