"""A claim request's ``Idempotency-Key`` (docs/workers.md, "Retrying a claim"): claim, claim-next and batch claims sent
again with the key of a request that was granted answer its grants again — the worker learns what it holds instead
of taking a second task while the first, whose answer it never got, runs out its lease.

The API names the request (``requested``); the claim services call, inside their transaction:

1. ``reserved`` once the namespace is held and the wrapping app's guard has checked, before any other check (as a
   repeated commit answers its stored body first): the grants stored under the key, if any — else the key's row is
   inserted, the first lock the claim takes after the namespace's. Its unique constraint (principal, key) decides
   between two copies of one request in flight at once: the second's insert waits for the first's transaction and,
   on its commit, fails; ``once`` runs the second again, which now answers the first's grants. Taken before any task
   or resource lock, so the copy that waits holds nothing the first needs.
2. ``Reserved.keep`` once the grants are written, in the same transaction: the row gets them, and commits or rolls
   back with them — a refusal keeps no key, nor does a request that granted nothing (a repeat may be granted).

Where the wrapping app has legacy decide (``Guard.keeps_claim_keys``) keys are not used: the legacy protocol has
none.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from django.db import IntegrityError

from .. import interleave
from ..errors import Invalid
from ..models import ClaimKey, Principal
from ._base import NamespaceHold, keeps_claim_keys

HEADER = "Idempotency-Key"
T = TypeVar("T")


@dataclass(frozen=True)
class Requested:
    key: str
    request: str  # the digest of what was asked: the same key with another request is refused


_requested: ContextVar[Requested | None] = ContextVar("claim_key", default=None)


@contextmanager
def requested(request: Requested | None) -> Iterator[None]:
    """Claims made inside this block are the request ``request`` names (None: a request without a key)."""
    token = _requested.set(request)
    try:
        yield
    finally:
        _requested.reset(token)


def _in_use(ns: NamespaceHold) -> Requested | None:
    request = _requested.get()
    return request if request is not None and keeps_claim_keys(ns) else None


@dataclass
class Reserved:
    """This request's key in the claim's transaction: the grants stored under it (``replay``), or its row, inserted
    first thing — a copy of the request in flight waits on it — and given the grants by ``keep``."""

    replay: list[dict[str, Any]] | None = None
    row: int | None = None

    def keep(self, grants: list[Any]) -> None:
        """The grants (``ClaimGrant``), once written, in the same transaction; none: the key is not kept."""
        if self.row is None:
            return
        if not grants:
            ClaimKey.objects.filter(pk=self.row).delete()
            return
        answers = json.loads(json.dumps([grant.fields() for grant in grants], default=_as_json))
        ClaimKey.objects.filter(pk=self.row).update(grants=answers)


def reserved(principal: Principal, ns: NamespaceHold) -> Reserved:
    """Once the namespace is held and the app's guard has checked, before any other check: the stored grants of
    this request's key, or its row inserted (none: no key, or keys not used here)."""
    request = _in_use(ns)
    if request is None:
        return Reserved()
    stored = ClaimKey.objects.filter(principal=principal, key=request.key).first()
    if stored is not None:
        if stored.request != request.request:
            raise Invalid({HEADER: ["was sent with another claim request: a new request needs a new key"]})
        return Reserved(replay=list(stored.grants))
    interleave.reach("claim_keys.looked")
    row = ClaimKey.objects.create(
        principal=principal,
        key=request.key,
        request=request.request,
        namespace_id=ns.id,
        grants=[],
        created_at=ns.now,
    )
    return Reserved(row=row.pk)


def once(service: Callable[..., T]) -> Callable[..., T]:
    """Run a claim service again when its key row lost to a copy of the same request committed meanwhile: the
    second run answers that copy's grants."""

    @functools.wraps(service)
    def run(*args: Any, **kwargs: Any) -> T:
        try:
            return service(*args, **kwargs)
        except IntegrityError as exc:
            if _requested.get() is None or "claimkey" not in str(exc).lower():
                raise
            return service(*args, **kwargs)

    return run


def _as_json(value: Any) -> str:
    """A grant's instants to the microsecond (DjangoJSONEncoder keeps milliseconds), its ids as text."""
    return value.isoformat() if isinstance(value, datetime) else str(value)
