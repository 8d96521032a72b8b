"""claim-client: the worker SDK for the claim control plane (claim.v1). See ``claim_client.client``."""

from __future__ import annotations

from .client import ControlPlane, error_of
from .digest import digest
from .errors import (
    ClaimError,
    ClaimRejected,
    Forbidden,
    Invalid,
    NotFound,
    Throttled,
    Unauthenticated,
    Unavailable,
)
from .lease import Lease
from .outcomes import *  # noqa: F403 - one exception class per outcome word
from .outcomes import BY_OUTCOME
from .values import Claim, Committed, EffectFailed, EffectResult, EffectTicket, EffectUnknown

__version__ = "1.10.0"
__all__ = [
    "BY_OUTCOME",
    "Claim",
    "ClaimError",
    "ClaimRejected",
    "Committed",
    "ControlPlane",
    "EffectFailed",
    "EffectResult",
    "EffectTicket",
    "EffectUnknown",
    "Forbidden",
    "Invalid",
    "Lease",
    "NotFound",
    "Throttled",
    "Unauthenticated",
    "Unavailable",
    "digest",
    "error_of",
    *(cls.__name__ for cls in BY_OUTCOME.values()),
]
