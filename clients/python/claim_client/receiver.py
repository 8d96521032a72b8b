"""Receiver-side fencing: enforce claim.v1 fence tokens in *your own* database.

A service that receives writes from workers (directly, or from the dispatch gateway, which sends
``X-Fence-Token: <resource_key>=<token>``) can refuse a delayed write from a previous holder without asking the
control plane: keep, per resource, the highest token seen, and in the same transaction as the write, check and
advance it atomically. The control plane's ``POST /resources/{key}/check`` is advisory (a takeover can happen
between its answer and your write); this is not, because the guard row stays locked until your write commits.

Usage in a downstream Django project::

    # models.py
    from claim_client.receiver import FenceGuard

    class InvoiceFence(FenceGuard):
        pass

    # where the write happens
    from django.db import transaction
    from claim_client.receiver import StaleToken, guard_write, parse_fence_header

    with transaction.atomic():
        for key, token in parse_fence_header(request.headers.getlist("X-Fence-Token")).items():
            guard_write(InvoiceFence, resource_key=key, token=token)   # raises StaleToken
        Invoice.objects.create(...)                                    # only a current holder gets here

Tokens of a key never restart (not even when the resource is deleted and created again), so "newer" is simply
"larger". A holder may write several times with its token: equal tokens are accepted.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, models, transaction


class StaleToken(Exception):
    """The write carries a token older than one this receiver has already accepted for the resource."""

    def __init__(self, resource_key: str, token: int, highest: int):
        super().__init__(f"fence token {token} for {resource_key} is older than {highest}")
        self.resource_key, self.token, self.highest = resource_key, token, highest


class FenceGuard(models.Model):
    """Subclass it in your app (and make a migration): one row per resource key."""

    resource_key = models.CharField(max_length=200, unique=True)
    highest_token = models.PositiveBigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        abstract = True


def guard_write(model: Any, *, resource_key: str, token: int) -> None:
    """Accept ``token`` for ``resource_key`` or raise StaleToken — call it inside the transaction of the write.

    A compare-and-set: ``UPDATE … SET highest_token = token WHERE resource_key = key AND highest_token <= token``.
    One row changed: accepted, and the row stays locked until the caller's transaction ends, so a concurrent
    older writer waits and is then refused. No row: either the key is new (insert it) or the token is stale.
    """
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("guard_write must run inside the transaction of the write it guards")
    if model.objects.filter(resource_key=resource_key, highest_token__lte=token).update(highest_token=token):
        return
    try:
        with transaction.atomic():
            model.objects.create(resource_key=resource_key, highest_token=token)
        return
    except IntegrityError:
        pass  # the key exists: our token is older than its highest (or a racer just inserted a newer one)
    highest = model.objects.filter(resource_key=resource_key).values_list("highest_token", flat=True).first()
    if highest is not None and token >= highest:  # a racer inserted the same or an older token meanwhile
        guard_write(model, resource_key=resource_key, token=token)
        return
    raise StaleToken(resource_key, token, highest or 0)


def parse_fence_header(values: list[str]) -> dict[str, int]:
    """``["repo:main=7", "db:orders=3"]`` → ``{"repo:main": 7, "db:orders": 3}`` (the gateway's X-Fence-Token)."""
    fences: dict[str, int] = {}
    for value in values:
        for item in value.split(","):
            key, sep, token = item.strip().rpartition("=")
            if not sep or not key or not token.isdigit():
                raise ValueError(f"malformed X-Fence-Token {item!r}")
            fences[key] = int(token)
    return fences
