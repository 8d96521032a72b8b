"""The worker path per rollout stage, side by side in one run (issue 22): V1_ONLY, SHADOW and V1_WRITES, each a
namespace of its own at that stage, served by one server, the same W worker processes doing the same cycles —
claim-next + commit with the result inline (two requests a task), and batched (claim 10 + commit 10) — measured in
turn, ``--repeat`` times, so that a slow minute hits every stage alike.

    createdb controlplane_bench
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/controlplane_bench python bench/stages.py --seconds 8

Target: SHADOW ≥ 0.6 × V1_ONLY. Writes bench/results/stages-<timestamp>.json and prints the Markdown table recorded
in docs/benchmarks.md. Every task is checked afterwards: handed to one attempt only; where legacy decides, each
claim and commit is in legacy's history and compared.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

STAGES = ("V1_ONLY", "SHADOW", "V1_WRITES")
PATHS = {"single": 1, "batch10": 10}


def seed_at(stage: str, label: str, tasks: int) -> str:
    """A namespace at ``stage`` with ``tasks`` READY tasks."""
    from django.utils import timezone

    from bench.claims import seed
    from rollout.models import RolloutState

    namespace = f"bench-{label}-{stage.lower().replace('_', '-')}-{int(time.time())}"
    ns_id = seed(namespace, tasks)
    RolloutState.objects.create(namespace_id=ns_id, stage=stage, updated_at=timezone.now())
    return namespace


def checked(namespace: str, stage: str, handed: list[str]) -> dict[str, int]:
    """What the records say of the run: tasks handed twice, and where legacy decides, claims and commits that
    are missing from legacy's history or from the comparisons."""
    from rollout.models import ComparedOperation, LegacyEvent

    twice = len(handed) - len(set(handed))
    figures = {"handed_twice": twice}
    if stage == "SHADOW":
        decided = LegacyEvent.objects.filter(namespace=namespace).count()
        compared = ComparedOperation.objects.filter(namespace=namespace).count()
        figures["legacy_decisions"] = decided
        figures["uncompared"] = decided - compared
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--tasks", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--port", type=int, default=8112)
    args = parser.parse_args()
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("bench/stages.py needs DATABASE_URL=postgres://… (a database of its own)")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connections

    from bench import http_client
    from bench.sidebyside import start_server, stop_server, tokens

    call_command("migrate", verbosity=0)
    url = f"http://127.0.0.1:{args.port}"
    rounds: list[dict[str, Any]] = []
    server = start_server(args.port, 2)
    try:
        for _ in range(args.repeat):
            row: dict[str, Any] = {}
            for path, batch in PATHS.items():
                for stage in STAGES:
                    namespace = seed_at(stage, path, args.tasks * batch)
                    connections.close_all()
                    result = http_client.run(
                        url, tokens(namespace, args.workers), namespace, args.seconds, batch
                    )
                    handed = result.pop("handed")
                    row[f"{path}/{stage}"] = {**result, **checked(namespace, stage, handed)}
            for path in PATHS:
                v1 = row[f"{path}/V1_ONLY"]["rate"]
                row[f"{path}/ratios"] = {stage: row[f"{path}/{stage}"]["rate"] / v1 for stage in STAGES}
            print(json.dumps({k: v.get("rate", v) for k, v in row.items()}), flush=True)
            rounds.append(row)
    finally:
        stop_server(server)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out = ROOT / "bench" / "results" / f"stages-{stamp}.json"
    meta = {"when": stamp, "seconds": args.seconds, "workers": args.workers, "cpus": os.cpu_count()}
    out.write_text(json.dumps({"meta": meta, "rounds": rounds}, indent=2, default=str))
    _print(rounds, args.workers)
    print(f"\nwritten to {out.relative_to(ROOT)}")


def _print(rounds: list[dict[str, Any]], workers: int) -> None:
    print(f"\n| path, W={workers} | " + " | ".join(STAGES) + " | SHADOW ÷ V1_ONLY | V1_WRITES ÷ V1_ONLY |")
    print("|---|" + "---:|" * (len(STAGES) + 2))
    for path in PATHS:
        for index, row in enumerate(rounds):
            rates = " | ".join(f"{row[f'{path}/{stage}']['rate']:,.0f} /s" for stage in STAGES)
            ratios = row[f"{path}/ratios"]
            print(
                f"| {path}, round {index + 1} | {rates} | {ratios['SHADOW']:.2f} | {ratios['V1_WRITES']:.2f} |"
            )
    problems = sum(
        row[key].get("handed_twice", 0) + row[key].get("uncompared", 0) + row[key].get("errors", 0)
        for row in rounds
        for key in row
        if not key.endswith("ratios")
    )
    print(f"| tasks handed twice, uncompared legacy decisions, refused requests | {problems} |")


if __name__ == "__main__":
    main()
