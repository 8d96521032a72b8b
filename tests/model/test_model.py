"""Issue 21, 3 — the claim protocol as a Promela model (model/claim.pml), checked exhaustively by Spin in CI: the
model as the code implements it passes both checks (the safety assertions over the whole state space; progress as
LTL under weak fairness), and each deliberately broken variant is rejected by the same checks. docs/model.md maps
the model's steps to the functions that implement them.

Needs Debian's ``spin`` and a C compiler (.ci/run installs spin); skipped visibly without them."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

MODELS = Path(__file__).resolve().parents[2] / "model"
MODEL = MODELS / "claim.pml"
PRIORITY = MODELS / "priority.pml"  # claim-v1.md §10: the grant order by priority, and starvation freedom

pytestmark = pytest.mark.skipif(
    shutil.which("spin") is None or shutil.which("gcc") is None,
    reason="needs Debian's spin and gcc (.ci/run installs spin: apt-get install spin)",
)


@dataclass
class Verdict:
    check: str  # "safety" or "progress"
    errors: int
    states: int
    found: str  # the first error pan reported ("" when none)


def _pan(workdir: Path, defines: list[str], *, progress: bool, model: Path = MODEL) -> Verdict:
    """Generate the verifier for ``defines``, compile it and run one check, exhaustively (no bitstate)."""
    shutil.copy(model, workdir / model.name)
    subprocess.run(
        ["spin", *[f"-D{d}" for d in defines], "-a", model.name],
        cwd=workdir,
        check=True,
        capture_output=True,
    )
    flags = ["-DCOLLAPSE"] if progress else ["-DNOCLAIM", "-DSAFETY", "-DCOLLAPSE"]
    subprocess.run(
        ["gcc", "-w", "-O2", *flags, "-o", "pan", "pan.c"], cwd=workdir, check=True, capture_output=True
    )
    args = ["./pan", "-m200000"] + (["-a", "-f"] if progress else [])
    out = subprocess.run(args, cwd=workdir, capture_output=True, text=True, timeout=600).stdout
    errors = int(re.search(r"errors: (\d+)", out).group(1))
    states = int(float(re.search(r"([\d.e+]+) states, stored", out).group(1)))
    found = re.search(r"pan:1: (.*)", out)
    assert "search not completed" not in out and "max search depth too small" not in out, out
    return Verdict("progress" if progress else "safety", errors, states, found.group(1) if found else "")


def verify(workdir: Path, *defines: str, model: Path = MODEL) -> list[Verdict]:
    """The checks, in order, stopping at the first that rejects the model."""
    verdicts = []
    for progress in (False, True):
        verdicts.append(_pan(workdir, list(defines), progress=progress, model=model))
        if verdicts[-1].errors:
            break
    return verdicts


def test_the_model_of_the_code_holds_its_safety_and_progress_properties(tmp_path):
    safety, progress = verify(tmp_path)

    assert (safety.errors, progress.errors) == (0, 0), (safety, progress)
    assert safety.states > 1_000_000  # the whole space of the configuration, not a sliver of it
    print(
        f"\nMODEL safety: {safety.states} states, 0 errors; progress (weak fairness): {progress.states}, 0 errors"
    )


@pytest.mark.parametrize(
    ("variant", "check", "found"),
    [
        ("BROKEN_NO_GENERATION_CHECK", "safety", "assertion violated"),  # a stale attempt's commit accepted
        ("BROKEN_BATCH_SHARES_KEY", "safety", "assertion violated"),  # two holders of K
        ("BROKEN_WAKE_OLDEST", "progress", "acceptance cycle"),  # a task left READY while its waiter sleeps
        ("BROKEN_NO_WAKE_ON_FREE", "progress", "acceptance cycle"),
    ],
)
def test_a_broken_variant_is_rejected_by_the_same_checks(tmp_path, variant, check, found):
    verdicts = verify(tmp_path, variant)

    failed = verdicts[-1]
    assert failed.errors == 1 and failed.check == check and failed.found.startswith(found), verdicts


def test_the_priority_model_holds_the_grant_order_and_starvation_freedom(tmp_path):
    """model/priority.pml: no grant of a lower priority while a higher one was claimable by the request; once urgent
    tasks stop arriving, the low-priority task is granted — even beside a stale urgent claim no live worker admits."""
    safety, progress = verify(tmp_path, model=PRIORITY)

    assert (safety.errors, progress.errors) == (0, 0), (safety, progress)
    print(f"\nPRIORITY MODEL safety: {safety.states} states, 0 errors; progress: {progress.states}, 0 errors")


@pytest.mark.parametrize(
    ("variant", "check", "found"),
    [
        ("BROKEN_OLDEST_FIRST", "safety", "assertion violated"),  # a lower priority granted first
        (
            "BROKEN_BOUND_IGNORES_FILTER",
            "progress",
            "acceptance cycle",
        ),  # the low task starved by a stale claim
    ],
)
def test_a_broken_priority_variant_is_rejected(tmp_path, variant, check, found):
    verdicts = verify(tmp_path, variant, model=PRIORITY)

    failed = verdicts[-1]
    assert failed.errors == 1 and failed.check == check and failed.found.startswith(found), verdicts
