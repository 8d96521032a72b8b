"""The bulk import of a team's table on entering SHADOW (docs/adopting.md, "Every row discovered"): a legacy table of
--rows rows made claim.v1 tasks through rollout.services.adoption (batches of LEGACY_IMPORT_BATCH), timed, with the
progress lines the command prints. PostgreSQL or MySQL/MariaDB as the team's database.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/controlplane_bench \\
    LEGACY_DATABASE_URL=postgres://postgres@127.0.0.1:5432/controlplane_bench_legacy \\
        .venv/bin/python bench/legacy_import.py --rows 100000

The control plane's database must be migrated (``claimctl migrate``); the legacy database must exist (the script
creates its table). Results are printed and written to bench/results/legacy-import-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
from examples.legacy_jobs.app import MAPPING as EXAMPLE  # noqa: E402 - after the checkout is on the path

MAPPING = {**EXAMPLE, "table": "bench_jobs", "input": "payload"}
os.environ["ROLLOUT_LEGACY_STORE"] = "rollout.legacy_table.TableLegacyStore"
NAMESPACE = f"bench-import-{datetime.now(UTC):%Y%m%d%H%M%S}"  # the timeline is append-only: a new one per run
os.environ["ROLLOUT_LEGACY_TABLE"] = json.dumps({**MAPPING, "namespace_map": {"billing": NAMESPACE}})


def fill(rows: int) -> str:
    from django.db import connections

    legacy = connections["legacy"]
    with legacy.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS bench_jobs")
        if legacy.vendor == "postgresql":
            cursor.execute(
                "CREATE TABLE bench_jobs (job_id varchar(64) PRIMARY KEY, queue text NOT NULL, payload jsonb, "
                "locked_by text, locked_until timestamptz, output jsonb, finished_by text)"
            )
            cursor.execute(
                "INSERT INTO bench_jobs (job_id, queue, payload) SELECT 'job-' || lpad(i::text, 9, '0'), 'billing', "
                "jsonb_build_object('n', i) FROM generate_series(1, %s) i",
                [rows],
            )
        else:
            cursor.execute(
                "CREATE TABLE bench_jobs (job_id varchar(64) PRIMARY KEY, queue varchar(64) NOT NULL, payload json, "
                "locked_by varchar(200), locked_until datetime(6) NULL, output json, finished_by varchar(200))"
            )
            cursor.execute(
                "INSERT INTO bench_jobs (job_id, queue, payload) SELECT CONCAT('job-', LPAD(seq, 9, '0')), "
                f"'billing', JSON_OBJECT('n', seq) FROM seq_1_to_{int(rows)}"
            )
    return legacy.vendor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    args = parser.parse_args()
    import django

    django.setup()
    from django.conf import settings

    from claims import services as core
    from rollout.services import adoption, state

    namespace = NAMESPACE
    vendor = fill(args.rows)
    operator = core.principal_ensure(name="bench-operator", role="operator")
    state.namespace_create(principal=operator, name=namespace, stage="SHADOW", min_protocol="legacy")
    job = adoption.start(namespace=namespace, principal=operator)
    began = time.perf_counter()
    lines: list[str] = []

    def progress(at) -> None:
        if at.read % (settings.LEGACY_IMPORT_BATCH * 10) == 0 or at.read == at.total:
            line = f"{at.read}/{at.total} rows, {at.read / (time.perf_counter() - began):.0f} rows/s"
            lines.append(line)
            print(line, flush=True)

    done = adoption.run(job.pk, progress=progress)
    seconds = time.perf_counter() - began
    result = {
        "bench": "legacy_import",
        "at": datetime.now(UTC).isoformat(),
        "legacy_database": vendor,
        "rows": done.read,
        "tasks_made": done.created,
        "batch": settings.LEGACY_IMPORT_BATCH,
        "seconds": round(seconds, 2),
        "rows_per_second": round(done.read / seconds),
        "progress": lines,
    }
    print(json.dumps(result, indent=2))
    out = ROOT / "bench" / "results" / f"legacy-import-{vendor}-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
