"""A claim request's ``Idempotency-Key`` and what it was granted (docs/workers.md, "Retrying a claim")."""

from __future__ import annotations

from django.db import models

from .core import Namespace, Principal


class ClaimKey(models.Model):
    """One claim request that granted something, by the key its client sent: a repeat of the request with the same
    key answers these grants again instead of granting anew, so a claim whose answer was lost (a failover, a dropped
    connection) and sent again leaves its worker one attempt, not two. Written in the grant's own transaction: a
    grant lost with its transaction loses its key too, and the repeat grants afresh. ``request`` is the digest of
    what was asked; the same key with another request is refused. Kept CLAIM_KEY_RETENTION_SECONDS."""

    id = models.BigAutoField(primary_key=True)
    principal = models.ForeignKey(Principal, on_delete=models.CASCADE, related_name="+", db_index=False)
    key = models.CharField(max_length=200)
    request = models.CharField(max_length=71)
    namespace = models.ForeignKey(Namespace, on_delete=models.CASCADE, related_name="+", db_index=False)
    grants = models.JSONField()  # each grant's answer (ClaimGrant.fields()), as JSON
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.UniqueConstraint(fields=["principal", "key"], name="claimkey_once")]
        indexes = [models.Index(fields=["created_at"], name="claimkey_age")]
