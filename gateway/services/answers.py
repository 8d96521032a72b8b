"""What the gateway answers a model: MCP ``CallToolResult`` bodies (JSON, as sent on the wire). A refusal is a tool
error (``isError``) whose text says what happened and what to do next, with the contract's outcome word, reason and
current values in ``structuredContent`` for a program to read."""

from __future__ import annotations

from typing import Any

from claims.errors import ClaimError

META_PREFIX = "dev.claim-control-plane/"

# What a model should do after each refusal, in words it can act on.
ADVICE: dict[str, str] = {
    "FENCED": "This attempt no longer holds the task. Stop working on it and do not retry this call.",
    "CANCELLED": "The task was cancelled. Stop working on it.",
    "FORBIDDEN": "This token may not act for that attempt. Use your own attempt's endpoint.",
    "NOT_FOUND": "Check the attempt in the endpoint and the tool's name (tools/list).",
    "INVALID": "Fix the call and send it again.",
    "PAYLOAD_CONFLICT": (
        "This action already ran (or is running) with other arguments. Do not change the arguments of the same "
        "action: call it again with the arguments it was first given, or name another effect slot."
    ),
    "UNKNOWN": (
        "The tool did not answer in time, so it may have acted. Do not assume it failed and do not work around "
        "it: call it again with the same arguments later — the gateway checks what happened first and never "
        "runs it twice."
    ),
    "RECONCILE_REQUIRED": (
        "An earlier call of this action has an unknown outcome and the tool has no query rule: an operator must "
        "reconcile it in the console. Call again later with the same arguments."
    ),
    "APPROVAL_REQUIRED": (
        "This tool runs only after an operator approves the call in the console. Call again later with the same "
        "arguments."
    ),
    "IN_FLIGHT": "Another call of this action is still running. Call again with the same arguments for its answer.",
    "INVALID_TRANSITION": "This action cannot run now. Call again later with the same arguments.",
    "STALE_INPUT": "A newer claim holds this task's resources. Stop working on this task.",
    "UNAVAILABLE": "The tool's server cannot be reached now. Call again later with the same arguments.",
}


def refusal(
    outcome: str,
    message: str,
    *,
    reason: str | None = None,
    current: dict[str, Any] | None = None,
    effect_id: str = "",
) -> dict[str, Any]:
    head = f"{outcome} ({reason})" if reason and reason != outcome else outcome
    sentence = message.strip().rstrip(".") + "." if message.strip() else ""
    text = f"{head}: {sentence} {ADVICE.get(outcome, '')}".strip()
    structured: dict[str, Any] = {"outcome": outcome}
    if reason:
        structured["reason"] = reason
    if current:
        structured["current"] = current
    if effect_id:
        structured["effect_id"] = effect_id
    return {
        "content": [{"type": "text", "text": text}],
        "structuredContent": structured,
        "isError": True,
        "_meta": {META_PREFIX + "outcome": outcome},
    }


def replayed(result: dict[str, Any], effect_id: str) -> dict[str, Any]:
    """A recorded answer given again, marked in ``_meta`` so a client can tell (a model need not)."""
    meta = {
        **(result.get("_meta") or {}),
        META_PREFIX + "replayed": True,
        META_PREFIX + "effect_id": effect_id,
    }
    return {**result, "_meta": meta}


def from_error(exc: ClaimError, *, effect_id: str = "") -> dict[str, Any]:
    current = {
        k: (str(v) if not isinstance(v, int | str | bool | None) else v) for k, v in exc.current.items()
    }
    return refusal(exc.outcome, exc.detail, reason=exc.reason, current=current, effect_id=effect_id)


def happened(effect_id: str, external_ref: str) -> dict[str, Any]:
    """The answer to a repeat of a call that happened but whose answer the gateway never had (reconciled OCCURRED,
    or recorded through the REST effect API). A tool error by form — a client checks a successful answer against the
    tool's output schema, which nothing recorded can meet — whose words say it is done."""
    ref = f" ({external_ref})" if external_ref else ""
    return {
        "content": [
            {
                "type": "text",
                "text": f"ALREADY_COMMITTED: this action already happened{ref}; its original answer was not "
                "recorded. It is done: do not run it again, and go on with the task.",
            }
        ],
        "structuredContent": {"outcome": "ALREADY_COMMITTED", "effect_id": effect_id},
        "isError": True,
        "_meta": {META_PREFIX + "outcome": "ALREADY_COMMITTED", META_PREFIX + "effect_id": effect_id},
    }
