"""The rollout's refusals: typed, shaped once by ``claims.errors.exception_handler`` like the core's."""

from __future__ import annotations

from typing import Any

from claims.errors import Conflict, register_words


class ProtocolTooOld(Conflict):
    outcome = "PROTOCOL_TOO_OLD"


class StageNotOpen(Conflict):
    outcome = "STAGE_NOT_OPEN"


class GateNotMet(Conflict):
    outcome = "GATE_NOT_MET"


class RollbackInProgress(Conflict):
    outcome = "ROLLBACK_IN_PROGRESS"


class LegacyRefused(Conflict):
    """Where legacy decides, its own refusal word (HELD, NOT_OWNER) is the answer's outcome and reason; ``extra``
    carries the routed answer's other fields (claim.v1's shadow verdict, ``decided_by``)."""

    def __init__(
        self, word: str, detail: str, *, current: dict[str, Any], extra: dict[str, Any] | None = None
    ):
        if (
            word not in LEGACY_WORDS
        ):  # MISSING: the team's table has no row for the task (rollout.legacy_table)
            word, detail = "NOT_OWNER", f"{detail}: the legacy table has no row for this task"
        super().__init__(detail, reason=word, current=current, extra=extra)
        self.outcome = word


# Legacy's own refusal words where it decides (rollout.legacy), each a LegacyRefused's outcome — the contract's two
# (rollout.md); the store's MISSING reaches the wire as NOT_OWNER, naming no owner.
LEGACY_WORDS = ("HELD", "NOT_OWNER")
# STAGE_CHANGED: the stage kept moving under a routed request; ROLLBACK: a rollback holds the pause (PAUSE_HELD).
register_words(outcomes=LEGACY_WORDS, reasons=(*LEGACY_WORDS, "STAGE_CHANGED", "ROLLBACK"))
