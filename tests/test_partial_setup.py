"""`make test` on a partial set-up (issue 37): with PostgreSQL and LEGACY_MYSQL_URL set but no
LEGACY_OBSERVE_PG_URL, the migration drill errored in set-up ("… 'legacy_logical' which is not defined") and make
stopped before the core profile's run. Each optional service missing must be a visible skip naming the variable to
set. Proven by collecting the test modules that name a database under every combination of the optional variables unset: every
test that names a database the combination lacks is skipped, and its reason names the variable."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ["LEGACY_MYSQL_URL", "LEGACY_BINLOG_URL", "LEGACY_OBSERVE_PG_URL"]
ALIAS_OF = {"LEGACY_MYSQL_URL": "legacy_mysql", "LEGACY_BINLOG_URL": "legacy_binlog", "LEGACY_OBSERVE_PG_URL": "legacy_logical"}  # fmt: skip

# Run in a process of its own (settings read the variables once): collect, and say for each test the databases it
# names, those the settings lack, and whether it is skipped and why (skip, or a skipif whose condition holds).
PROBE = r"""
import json, sys
import pytest

class Probe:
    def pytest_collection_finish(self, session):
        from django.conf import settings
        out = []
        for item in session.items:
            mark = item.get_closest_marker("django_db")
            wanted = mark.kwargs.get("databases", []) if mark else []
            wanted = [] if wanted == "__all__" else list(wanted)
            skips = [m.kwargs.get("reason", "") for m in item.iter_markers("skip")]
            skips += [m.kwargs.get("reason", "") for m in item.iter_markers("skipif") if m.args and m.args[0]]
            out.append({"id": item.nodeid, "missing": [a for a in wanted if a not in settings.DATABASES],
                        "skips": skips})
        print("PROBE" + json.dumps(out))

sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", *sys.argv[1:]], plugins=[Probe()]))
"""


def _combinations() -> list[tuple[str, ...]]:
    present = [name for name in OPTIONAL if os.environ.get(name)]
    return [c for n in range(len(present) + 1) for c in itertools.combinations(present, n)]


def _modules_naming_databases() -> list[str]:
    """The test modules that name a database beyond the default (the only ones a missing variable can touch)."""
    named = re.compile(r"databases=|" + "|".join(ALIAS_OF.values()))
    return sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "tests").rglob("test_*.py")
        if path.name != Path(__file__).name and named.search(path.read_text())
    )


def _collect(unset: tuple[str, ...], modules: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in unset}
    return subprocess.run(
        [sys.executable, "-c", PROBE, *modules],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def collected() -> dict[tuple[str, ...], subprocess.CompletedProcess[str]]:
    """Every combination collected at once, two processes at a time (each is a second of start-up, mostly)."""
    modules, combinations = _modules_naming_databases(), _combinations()
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(combinations, pool.map(lambda c: _collect(c, modules), combinations), strict=True))


def test_the_probe_sees_every_module_that_names_a_database():
    modules = _modules_naming_databases()
    assert "tests/rollout/test_drill.py" in modules and "tests/e2e/test_drill_console.py" in modules
    assert len(modules) >= 10


@pytest.mark.skipif(
    not os.environ.get("DATABASE_URL"), reason="the legacy databases need PostgreSQL (DATABASE_URL)"
)
@pytest.mark.parametrize("unset", _combinations(), ids=lambda c: "+".join(c) or "all-set")
def test_every_optional_service_missing_is_a_skip_naming_its_variable(unset, collected):
    done = collected[unset]
    line = next((x for x in done.stdout.splitlines() if x.startswith("PROBE")), None)
    assert done.returncode == 0 and line, done.stdout[-3000:] + done.stderr[-3000:]
    items = json.loads(line[5:])

    would_error = [i["id"] for i in items if i["missing"] and not i["skips"]]
    assert not would_error, f"with {unset or 'nothing'} unset these error in set-up: {would_error}"
    for item in items:
        for variable, alias in ALIAS_OF.items():
            if alias in item["missing"]:
                assert any(variable in reason for reason in item["skips"]), (item, variable)
    assert len(items) > 50  # the suites were collected
