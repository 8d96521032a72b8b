"""The gateway's writers: each tool call's steps on the core's effect ledger (``calls``) and the operator's
configuration of downstream servers and tool rules (``registry``)."""

from .calls import (
    Call,
    Step,
    call_begin,
    call_heard,
    call_lost,
    call_plan,
    call_reconcile,
    call_record,
    call_start,
    call_waited,
    calls_sweep_lost,
)
from .registry import downstream_save, downstream_values, gateway_apply, tool_rule_set

__all__ = [
    "Call",
    "Step",
    "call_begin",
    "call_heard",
    "call_lost",
    "call_plan",
    "call_start",
    "call_waited",
    "call_reconcile",
    "call_record",
    "calls_sweep_lost",
    "downstream_save",
    "downstream_values",
    "gateway_apply",
    "tool_rule_set",
]
