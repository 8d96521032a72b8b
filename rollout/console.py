"""The rollout's console presentation: what its pages draw from the domain reads (``rollout.selectors``) — the
gate checklist, the mismatch drill-down, the charts. Nothing here writes."""

from __future__ import annotations

import difflib
import json
from datetime import datetime, timedelta
from typing import Any

from claims.models import Attempt, Namespace, StagedResult, Task, TaskEvent
from claims.ui import chart

from .legacy import legacy_store
from .models import (
    DrainSnapshot,
    GateEvaluation,
    LegacyClaim,
    LegacyEvent,
    Mismatch,
    MismatchReason,
    MismatchStatus,
    Stage,
)


def _share(part: int, whole: int) -> str:
    """A count against what a condition needs: "199 of 200 needed", "met: 2303 (200 needed)" — never a rounded
    100 % that is not met, nor a share over 100 %."""
    if part >= whole:
        return f"met: {part} ({whole} needed)"
    return f"{part} of {whole} needed"


def _validated(part: int, whole: int) -> str:
    """Validated requests of an acceptance point: every one, or how many of how many (the percentage rounded down, so
    199 of 200 is 99 %, not 100 %)."""
    if part == whole:
        return f"all {whole} validated"
    return f"{part} of {whole} validated ({100 * part // whole} %)"


def gate_checklist(
    namespace: Namespace, gate: GateEvaluation | None, coverage_now: dict[str, Any]
) -> list[dict]:
    """The recorded gate as a checklist: each condition with its figure, what it needs, whether it is met, where to
    look (``link``: a console URL name and its query) and, for an acceptance point with no traffic, that it may be
    waived. The figures are the evaluation's own; coverage counts come from ``coverage`` (the same window)."""
    if gate is None:
        return []
    f, rows = gate.figures, []
    of_ns = f"ns={namespace.name}"  # the pools and effects pages, filtered to this namespace

    def row(label: str, value: str, need: str, ok: bool, link: tuple[str, str] | None = None, **extra: Any):
        rows.append({"label": label, "value": value, "need": need, "ok": ok, "link": link, **extra})

    stage = gate.move.split(" → ")[0]
    if stage == Stage.LEGACY:
        row("claim.v1 workers with a fresh heartbeat", str(f["v1_workers"]), "at least 1", f["v1_workers"] >= 1,
            ("console:pools", of_ns))  # fmt: skip
    elif stage == Stage.SHADOW:
        row("compared operations in the window", _share(f["compared"], f["min_samples"]),
            f"at least {f['min_samples']}", f["compared"] >= f["min_samples"])  # fmt: skip
        row("open mismatches", str(f["open_mismatches"]), "none", not f["open_mismatches"],
            ("console:mismatches", "status=OPEN"))  # fmt: skip
        row("mismatches marked BUG", str(f["bug_mismatches"]), "none", not f["bug_mismatches"],
            ("console:mismatches", "status=BUG"))  # fmt: skip
    elif stage == Stage.V1_READS:
        for point, p in coverage_now["points"].items():
            covered = (p["total"] and p["validated"] == p["total"]) or (not p["total"] and p["waived"])
            value = (
                _validated(p["validated"], p["total"])
                if p["total"]
                else ("waived" if p["waived"] else "no traffic")
            )
            row(f"validated at {point}", value, "100 %, or waived when there is no traffic", bool(covered),
                point=point, waivable=not p["total"] and not p["waived"])  # fmt: skip
        row("requests in the window", _share(f["requests"], f["min_samples"]), f"at least {f['min_samples']}",
            f["requests"] >= f["min_samples"])  # fmt: skip
    else:
        row("live leases in the legacy pool", str(f["active_leases"]), "none", not f["active_leases"],
            ("console:pools", of_ns))  # fmt: skip
        row("UNKNOWN effects", str(f["unknown_effects"]), "none", not f["unknown_effects"],
            ("console:effects", of_ns))  # fmt: skip
        row("staged results awaiting commit", str(f["awaiting_commit"]), "none", not f["awaiting_commit"])
        pending = f.get("legacy_writes_pending", 0)  # absent from evaluations recorded before it was counted
        row("writes not yet in the legacy table", str(pending), "none", not pending)
        direct = f.get("direct_writes", 0)
        row("old binaries' direct writes to the legacy table, unreviewed", str(direct), "none", not direct,
            ("console:mismatches", "reason=DIRECT_WRITE&status=OPEN"))  # fmt: skip
        row("clean drain snapshots in a row", str(f["clean_streak"]), "at least 2", f["clean_streak"] >= 2)
        row("open mismatches", str(f["open_mismatches"]), "none", not f["open_mismatches"],
            ("console:mismatches", "status=OPEN"))  # fmt: skip
        row("mismatches marked BUG", str(f["bug_mismatches"]), "none", not f["bug_mismatches"],
            ("console:mismatches", "status=BUG"))  # fmt: skip
    return rows


REASON_EXPLANATIONS = {
    "DOUBLE_GRANT": "The two stores let different workers hold the task at once: one granted a claim while the other "
    "still had a live holder. Two workers may then both compute — and, under legacy, both write.",
    "STALE_COMMIT_ACCEPTED": "Legacy accepted a result from a worker claim.v1 had already fenced (its lease had been "
    "taken over, its epoch fenced, its task cancelled or its input revised). This is the lost update the migration "
    "exists to prevent: legacy's last write wins.",
    "V1_REJECTED_ONLY": "Legacy accepted an operation claim.v1 refused. Either claim.v1 is stricter here (expected "
    "for late workers) or it refuses something it should allow — read the refusal's reason.",
    "LEGACY_REJECTED_ONLY": "claim.v1 accepted an operation legacy refused. Usually legacy's view of the holder is "
    "out of date; check the legacy row's owner and expiry.",
    "WINNER_DIFFERS": "Both stores accepted a commit, but their canonical results now differ: legacy kept the last "
    "write, claim.v1 the first valid one.",
}


def _value_lines(value: Any) -> list[str]:
    return json.dumps(value, indent=2, sort_keys=True, default=str).splitlines() if value is not None else []


def mismatch_drilldown(mismatch: Mismatch) -> dict[str, Any]:
    """What a reviewer needs on one page: both stores' winners with their results and a diff; one timeline merging
    both stores' decisions on one time axis, in seconds from the first, with the operation that disagreed marked; what
    the reason means; and the previous and next OPEN mismatch of the namespace."""
    legacy_row = legacy_store().get(task_id=mismatch.task_id)  # their table, where the adapter is configured
    task = Task.objects.filter(pk=mismatch.task_id).first()
    winners = _winners(mismatch, legacy_row, task)
    diff = list(
        difflib.unified_diff(
            _value_lines(winners["legacy"]["result"]),
            _value_lines(winners["v1"]["result"]),
            "legacy",
            "claim.v1",
            lineterm="",
        )
    )
    open_here = Mismatch.objects.filter(namespace=mismatch.namespace, status=MismatchStatus.OPEN)
    return {
        "winners": winners,
        "diff": diff,
        "timeline": _merged_timeline(mismatch),
        "explanation": REASON_EXPLANATIONS.get(mismatch.reason, ""),
        "previous_open": open_here.filter(id__lt=mismatch.pk)
        .order_by("-id")
        .values_list("id", flat=True)
        .first(),
        "next_open": open_here.filter(id__gt=mismatch.pk).order_by("id").values_list("id", flat=True).first(),
        "legacy_row": legacy_row,
        "task": task,
    }


def _winners(
    mismatch: Mismatch, legacy_row: LegacyClaim | None, task: Task | None
) -> dict[str, dict[str, Any]]:
    """Each store's winner of the task: who completed it, with what result and digest."""
    canonical = StagedResult.objects.filter(task_id=mismatch.task_id, canonical=True).first()
    v1_owner = (
        Attempt.objects.filter(pk=canonical.attempt_id).values_list("owner_id", flat=True).first()
        if canonical
        else None
    )
    winners = {
        "legacy": {
            "owner": legacy_row.completed_by if legacy_row and legacy_row.completed_by else None,
            "result": legacy_row.result if legacy_row and legacy_row.completed_by else None,
            "digest": legacy_row.result_digest if legacy_row else "",
        },
        "v1": {
            "owner": v1_owner or (task.owner_id if task and task.result_commit_id else None),
            "result": task.result if task and task.result_commit_id else None,
            "digest": task.result_digest if task else "",
        },
    }
    for side in winners.values():
        side["text"] = "\n".join(_value_lines(side["result"])) or "—"
    return winners


def _merged_timeline(mismatch: Mismatch) -> list[dict[str, Any]]:
    """Both stores' decisions on the task on one time axis, seconds from the first, the disagreeing one marked."""
    entries: list[dict[str, Any]] = [
        {
            "at": e.at,
            "store": "legacy",
            "what": f"{e.operation} via the {e.api} API by {e.owner_id}",
            "verdict": e.verdict,
            "accepted": e.accepted,
        }
        for e in LegacyEvent.objects.filter(task_id=mismatch.task_id).order_by("at", "id")
    ] + [
        {
            "at": e.at,
            "store": "claim.v1",
            "what": f"{e.kind}{f' by {e.owner_id}' if e.owner_id else ''}"
            + (f" (gen {e.claim_generation})" if e.claim_generation else ""),
            "verdict": f"{e.detail.get('outcome', '')} {e.detail.get('reason', '')}".strip(),
            "accepted": e.kind != "fenced",
        }
        for e in TaskEvent.objects.filter(task_id=mismatch.task_id).order_by("id")
    ]
    entries.sort(key=lambda entry: entry["at"])
    first = entries[0]["at"] if entries else mismatch.at
    offending = min(
        (i for i, entry in enumerate(entries) if entry["store"] == "legacy"),
        key=lambda i: abs((entries[i]["at"] - mismatch.at).total_seconds()),
        default=None,
    )
    previous_at = first
    for index, entry in enumerate(entries):
        entry["seconds"] = round((entry["at"] - first).total_seconds(), 3)
        entry["after"] = round((entry["at"] - previous_at).total_seconds(), 3)
        entry["offending"] = index == offending
        previous_at = entry["at"]
    return entries


# A status's colour says what it means: a BUG red, an EXPLAINED mismatch green, one still OPEN amber.
STATUS_COLORS: dict[str, str] = {
    MismatchStatus.OPEN.value: "#8a5a00",
    MismatchStatus.EXPLAINED.value: "#1d6b38",
    MismatchStatus.BUG.value: "#8a1c1c",
}


def mismatches_per_hour(namespace: str, now: datetime, hours: int = 24) -> dict[str, dict[str, Any]]:
    """Mismatches recorded per hour over the last ``hours`` up to ``now`` (the page's clock: one recorded while
    the page renders is the next load's), stacked by reason and by status."""
    since = now - timedelta(hours=hours)
    rows = list(
        Mismatch.objects.filter(namespace=namespace, at__gte=since, at__lte=now).values_list(
            "reason", "status", "at"
        )
    )
    labels = [f"-{hours - i} h" for i in range(hours)]

    def stacked(values: list[str], pick: int, colors: dict[str, str] | None = None) -> dict[str, Any]:
        series = {value: [0] * hours for value in values}
        for row in rows:
            slot = hours - 1 - min(hours - 1, int((now - row[2]).total_seconds() // 3600))
            series[str(row[pick])][slot] += 1
        used = {k: v for k, v in series.items() if any(v)} or {values[0]: [0] * hours}
        return chart(
            kind="bar", labels=labels, series=used, x="hours ago", y="mismatches", stacked=True, colors=colors
        )

    return {
        "by_reason": stacked([str(r) for r in MismatchReason.values], 0),
        "by_status": stacked([str(s) for s in MismatchStatus.values], 1, STATUS_COLORS),
    }


def drain_progress(namespace: str, pool: str = "", limit: int = 20) -> dict[str, Any]:
    """The last ``limit`` drain snapshots' three counts, oldest first."""
    snaps = list(
        DrainSnapshot.objects.filter(namespace=namespace, pool=pool).order_by("-taken_at", "-id")[:limit]
    )[::-1]
    return chart(
        kind="line",
        labels=[snap.taken_at.strftime("%H:%M:%S") for snap in snaps],
        series={
            "live leases": [snap.active_leases for snap in snaps],
            "UNKNOWN effects": [snap.unknown_effects for snap in snaps],
            "awaiting commit": [snap.awaiting_commit for snap in snaps],
            "legacy writes pending": [snap.legacy_writes_pending for snap in snaps],
        },
        x="snapshot (UTC)",
        y="count",
    )


def coverage_chart(coverage_now: dict[str, Any]) -> dict[str, Any]:
    """Per acceptance point over the window: requests validated and not."""
    points = list(coverage_now["points"])
    return chart(
        kind="bar",
        labels=points,
        series={
            "validated": [coverage_now["points"][p]["validated"] for p in points],
            "not validated": [
                coverage_now["points"][p]["total"] - coverage_now["points"][p]["validated"] for p in points
            ],
        },
        x="acceptance point",
        y="requests in the window",
        stacked=True,
    )
