"""Rollout records: the legacy claim table, shadow mismatches, gate evaluations, drain snapshots, waivers,
rollbacks and worker registrations. Only ``rollout/services.py`` writes them. The claim.v1 core never imports
this app; deleting it one day must not touch the core."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q


class Stage(models.TextChoices):
    LEGACY = "LEGACY"
    SHADOW = "SHADOW"
    V1_READS = "V1_READS"
    V1_WRITES = "V1_WRITES"
    V1_ONLY = "V1_ONLY"


class Protocol(models.TextChoices):
    LEGACY = "legacy"
    CLAIM_V1 = "claim.v1"


# A namespace the core created alone (``default``, or one created without the rollout app) has no RolloutState:
# claim.v1 decides, nothing is mirrored, old workers may still register.
DEFAULT_STAGE = Stage.V1_ONLY
DEFAULT_PROTOCOL = Protocol.LEGACY


class RolloutState(models.Model):
    """A namespace's place in the migration: its stage and the oldest worker protocol it admits. The rollout's
    own record, one per namespace; a namespace without one (created by the core alone, like ``default``) is at
    V1_ONLY with ``min_protocol`` legacy — claim.v1 decides and nothing is mirrored. Written only by
    ``rollout.services.stages`` (and ``namespaces`` on create), always under the namespace's row lock."""

    namespace = models.OneToOneField(
        "claims.Namespace", on_delete=models.CASCADE, primary_key=True, related_name="rollout"
    )
    stage = models.CharField(max_length=16, choices=Stage.choices, default=DEFAULT_STAGE)
    min_protocol = models.CharField(max_length=16, choices=Protocol.choices, default=DEFAULT_PROTOCOL)
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(stage__in=Stage.values), name="rollout_stage_valid"),
            models.CheckConstraint(
                condition=Q(min_protocol__in=Protocol.values), name="rollout_protocol_valid"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.namespace_id}: {self.stage}"


class LegacyClaim(models.Model):
    """The naive claim table today's worker binaries speak: owner + expires_at; after expiry anyone takes over;
    completing writes the result without checking who holds the claim now — last write wins. Reproduced
    faithfully (behind ``rollout.legacy.LegacyStore``) so shadow mode can show where it goes wrong."""

    task_id = models.CharField(max_length=200, primary_key=True)
    # Every read by namespace asks for the incomplete rows, which legacy_incomplete holds: no index of its own (two,
    # with PostgreSQL's LIKE twin), each an entry more for every legacy claim and complete to write.
    namespace = models.CharField(max_length=100)
    owner_id = models.CharField(max_length=200, blank=True, default="")
    expires_at = models.DateTimeField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    result_digest = models.CharField(max_length=71, blank=True, default="")
    completed_by = models.CharField(max_length=200, blank=True, default="")
    # Which API made the last write: "legacy" or "claim.v1" (mirrored decisions in V1_WRITES).
    via = models.CharField(max_length=16, blank=True, default="")
    pool = models.CharField(max_length=100, blank=True, default="")
    updated_at = models.DateTimeField()

    class Meta:
        indexes = [
            # what is not completed yet: the legacy frontier's candidates (selectors.task_list), as small as it is
            models.Index(
                fields=["namespace", "task_id"], condition=models.Q(completed_by=""), name="legacy_incomplete"
            ),
        ]

    def __str__(self) -> str:
        return self.task_id


class MismatchReason(models.TextChoices):
    DOUBLE_GRANT = "DOUBLE_GRANT"
    STALE_COMMIT_ACCEPTED = "STALE_COMMIT_ACCEPTED"
    V1_REJECTED_ONLY = "V1_REJECTED_ONLY"
    LEGACY_REJECTED_ONLY = "LEGACY_REJECTED_ONLY"
    WINNER_DIFFERS = "WINNER_DIFFERS"
    # observe mode, from V1_WRITES on: the legacy table changed, and not by claim.v1's write-through — an old binary
    # still writes it directly (docs/adopting.md, runbook)
    DIRECT_WRITE = "DIRECT_WRITE"
    # where legacy decides, a fence ended a lease in claim.v1 that legacy, which knows no epochs, still keeps: a
    # claim legacy refused (HELD) by that lease's holder, or its holder's heartbeat or release legacy accepted.
    # Caused by the fence itself, not a bug of either store: recorded EXPLAINED at once (the gate is not held by it).
    FENCE_UNSEEN_BY_LEGACY = "FENCE_UNSEEN_BY_LEGACY"


class MismatchStatus(models.TextChoices):
    OPEN = "OPEN"
    EXPLAINED = "EXPLAINED"
    BUG = "BUG"


class Mismatch(models.Model):
    """One operation on which the two stores' verdicts disagreed. Review changes only status/note/reviewed_by;
    the verdicts themselves are never rewritten."""

    id = models.BigAutoField(primary_key=True)
    namespace = models.CharField(max_length=100)
    task_id = models.CharField(max_length=200)
    operation = models.CharField(max_length=16)  # claim | renew | release | commit | complete | heartbeat
    api = models.CharField(max_length=16)  # legacy | claim.v1
    legacy = models.JSONField()  # {verdict, owner_id}
    v1 = models.JSONField()  # {verdict, reason, attempt_id, claim_generation}
    reason = models.CharField(max_length=32, choices=MismatchReason.choices)
    status = models.CharField(max_length=16, choices=MismatchStatus.choices, default=MismatchStatus.OPEN)
    note = models.TextField(blank=True, default="")
    reviewed_by = models.CharField(max_length=200, blank=True, default="")
    explained_by_rule = models.ForeignKey("ExplainRule", null=True, blank=True, on_delete=models.PROTECT)
    at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["namespace", "status"], name="mismatch_ns_status"),
            models.Index(fields=["namespace", "reason", "at"], name="mismatch_ns_reason_at"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(reason__in=MismatchReason.values), name="mismatch_reason_valid"
            ),
            models.CheckConstraint(
                condition=Q(status__in=MismatchStatus.values), name="mismatch_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(status="EXPLAINED") | ~Q(note=""), name="mismatch_explained_has_note"
            ),
        ]


class ExplainRule(models.Model):
    """Marks future mismatches of a reason EXPLAINED as they arrive (Scientist's ignore blocks), audited."""

    id = models.BigAutoField(primary_key=True)
    namespace = models.CharField(max_length=100)
    reason = models.CharField(max_length=32, choices=MismatchReason.choices)
    note = models.TextField()
    created_by = models.CharField(max_length=200)
    created_at = models.DateTimeField()


class ComparedOperation(models.Model):
    """One operation both stores judged while both were written (the SHADOW → V1_READS gate counts them)."""

    id = models.BigAutoField(primary_key=True)
    namespace = models.CharField(max_length=100)
    operation = models.CharField(max_length=16)
    api = models.CharField(max_length=16)
    agreed = models.BooleanField()
    at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["namespace", "at"], name="compared_ns_at"),
            models.Index(fields=["at"], name="compared_at"),  # retention, oldest first
        ]


class StageChange(models.Model):
    """Every stage move of a namespace, with the gate figures it was made on (or the override's reason)."""

    id = models.BigAutoField(primary_key=True)
    namespace = models.CharField(max_length=100)
    from_stage = models.CharField(max_length=16)
    to_stage = models.CharField(max_length=16)
    principal = models.CharField(max_length=200)
    reason = models.TextField(blank=True, default="")
    override = models.BooleanField(default=False)
    figures = models.JSONField(default=dict)
    at = models.DateTimeField()

    class Meta:
        indexes = [models.Index(fields=["namespace", "at"], name="stagechange_ns_at")]


class GateEvaluation(models.Model):
    id = models.BigAutoField(primary_key=True)
    namespace = models.CharField(max_length=100)
    move = models.CharField(max_length=40)  # "SHADOW → V1_READS"
    holds = models.BooleanField()
    figures = models.JSONField()
    why = models.TextField()
    at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["namespace", "move", "at"], name="gate_ns_move_at"),
            models.Index(fields=["at"], name="gate_at"),  # retention, oldest first
        ]


class DrainSnapshot(models.Model):
    id = models.BigAutoField(primary_key=True)
    namespace = models.CharField(max_length=100)
    pool = models.CharField(max_length=100, blank=True, default="")
    active_leases = models.PositiveIntegerField()
    unknown_effects = models.PositiveIntegerField()
    awaiting_commit = models.PositiveIntegerField()
    # claim.v1 decisions not yet written through to a legacy table in another database (rollout.LegacyWrite)
    legacy_writes_pending = models.PositiveIntegerField(default=0)
    # observe mode: writes of old binaries straight to the legacy table not yet reviewed (open DIRECT_WRITE mismatches)
    direct_writes = models.PositiveIntegerField(default=0)
    # ``clean`` in the database and the API; not as the attribute, which would shadow Model.clean().
    is_clean = models.BooleanField(db_column="clean")
    clean_streak = models.PositiveIntegerField()
    taken_at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["namespace", "pool", "taken_at"], name="drain_ns_pool_at"),
            models.Index(fields=["taken_at"], name="drain_taken_at"),  # retention, oldest first
        ]


class CoverageWaiver(models.Model):
    id = models.BigAutoField(primary_key=True)
    namespace = models.CharField(max_length=100)
    point = models.CharField(max_length=8)
    reason = models.TextField()
    principal = models.CharField(max_length=200)
    at = models.DateTimeField()


class RollbackStep(models.TextChoices):
    """A rollback's steps, in order: its epoch fence is taken, then the namespace drains, then it is done."""

    FENCING = "FENCING"
    DRAINING = "DRAINING"
    DONE = "DONE"


class Rollback(models.Model):
    rollback_id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    namespace = models.CharField(max_length=100)
    from_stage = models.CharField(max_length=16)
    to_stage = models.CharField(max_length=16)
    step = models.CharField(max_length=16, choices=RollbackStep.choices)
    reason = models.TextField()
    principal = models.CharField(max_length=200)
    scheduler_epoch = models.PositiveBigIntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    forced = models.BooleanField(default=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["namespace"], condition=Q(finished_at__isnull=True), name="one_rollback_running"
            ),
            models.CheckConstraint(condition=Q(step__in=RollbackStep.values), name="rollback_step_valid"),
        ]


class WorkerRegistration(models.Model):
    """A worker's registration for a namespace: its protocol and binary version, its pool, its heartbeat."""

    id = models.BigAutoField(primary_key=True)
    principal = models.CharField(max_length=200)
    pool = models.CharField(max_length=100, blank=True, default="")
    namespace = models.CharField(max_length=100)
    protocol = models.CharField(max_length=32)
    binary_version = models.CharField(max_length=100)
    refused = models.BooleanField(default=False)
    registered_at = models.DateTimeField()
    last_heartbeat = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["principal", "namespace"], name="one_registration_per_ns")
        ]


class LegacyEvent(models.Model):
    """The legacy store's side of a task's history while the control plane serves it: every legacy decision,
    from either API (the mismatch drill-down shows it beside the claim.v1 timeline). Append-only."""

    id = models.BigAutoField(primary_key=True)
    namespace = models.CharField(max_length=100)
    task_id = models.CharField(max_length=200)
    operation = models.CharField(max_length=16)
    api = models.CharField(max_length=16)
    owner_id = models.CharField(max_length=200)
    verdict = models.CharField(max_length=16)
    accepted = models.BooleanField()
    at = models.DateTimeField()

    class Meta:
        indexes = [
            models.Index(fields=["task_id", "at"], name="legacyevent_task_at"),
            models.Index(fields=["at"], name="legacyevent_at"),  # retention, oldest first
        ]


class LegacyWrite(models.Model):
    """A claim.v1 decision to be written through to a legacy table in another database (V1_WRITES, a store with
    ``separate_database``): recorded in the decision's own transaction, so it is never lost; applied after that
    transaction commits — at once by the request, else by the ``apply_legacy_writes`` job, retried until applied
    (``rollout.services.write_through``). Only ``applied_at``, ``tries`` and ``error`` ever change."""

    id = models.BigAutoField(primary_key=True)
    namespace = models.CharField(max_length=100)
    task_id = models.CharField(max_length=200)
    kind = models.CharField(max_length=16)  # record | complete (rollout.legacy.LegacyAsk)
    fields = models.JSONField()  # the ask's keyword arguments (an expiry as ISO text)
    created_at = models.DateTimeField()
    applied_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, blank=True, default="")  # the store's word when applied
    tries = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True, default="")  # the last failed try's error

    class Meta:
        indexes = [
            # the backlog, oldest first: what the appliers, the drain and the metric read
            models.Index(fields=["id"], condition=Q(applied_at__isnull=True), name="legacywrite_pending"),
            # an observer telling claim.v1's own write-throughs from a direct write (services/observe.py)
            models.Index(fields=["task_id", "id"], name="legacywrite_task"),
        ]


class LegacyDecision(models.Model):
    """A legacy decision that wrote a legacy table in another database, recorded in our transaction before that
    database's transaction commits (``rollout.legacy.LegacyUnit``): our records of it commit first, theirs second.
    ``outcome`` says how it ended — COMMITTED when their commit is seen, ABORTED when it never happened (the process
    died between the two commits; ``rollout.services.legacy_decisions`` then undoes what claim.v1 did in its shadow).
    ``expected`` is the row as the decision wrote it, ``found`` the row as it found it (locked): the next decision
    on the task has found what this one left, which is how a crash is told from a commit later on."""

    id = models.BigAutoField(primary_key=True)
    namespace = models.CharField(max_length=100)
    task_id = models.CharField(max_length=200)
    operation = models.CharField(max_length=16)
    owner_id = models.CharField(max_length=200)
    found = models.JSONField()
    expected = models.JSONField()
    created_at = models.DateTimeField()
    resolved_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, blank=True, default="")  # COMMITTED | ABORTED
    undone = models.CharField(max_length=200, blank=True, default="")  # what claim.v1 undid, if anything

    class Meta:
        indexes = [
            models.Index(fields=["task_id", "id"], name="legacydecision_task"),
            models.Index(fields=["id"], condition=Q(resolved_at__isnull=True), name="legacydecision_open"),
        ]


class ObserverPosition(models.Model):
    """Where the observer of a legacy table (observe mode) is in its change stream: every transaction before ``lsn``
    judged, and of the one ending at ``lsn`` its first ``index`` changes. Written in the same transaction as each
    judgement's comparison, so a killed observer resumes judging no change twice and skipping none."""

    name = models.CharField(max_length=100, unique=True)  # the replication slot's, or poll:<table>
    # PostgreSQL: the LSN and the changes of its transaction judged. Polling (MySQL/MariaDB): the last row read,
    # by its ``changed`` value (as text) and key.
    lsn = models.CharField(max_length=40, default="0/0")
    index = models.PositiveIntegerField(default=0)
    key = models.CharField(max_length=200, blank=True, default="")
    # The binary log (MySQL/MariaDB): ``lsn`` is file:offset where a transaction begins, ``gtid`` its global id.
    gtid = models.CharField(max_length=200, blank=True, default="")
    judged = models.PositiveBigIntegerField(default=0)  # legacy decisions judged
    unknown = models.PositiveBigIntegerField(default=0)  # changes of tasks claim.v1 does not have
    last_commit_at = models.DateTimeField(null=True, blank=True)  # the newest judged transaction's commit
    lag_bytes = models.BigIntegerField(null=True, blank=True)  # WAL the slot still holds, as of updated_at
    # How far behind legacy's clock the last pass ended (0: it read all there was) and legacy's lease as last seen
    # (a claim or heartbeat: its expiry minus its commit) — the console and /metrics compare the two.
    behind_seconds = models.FloatField(null=True, blank=True)
    lease_seconds = models.FloatField(null=True, blank=True)
    # PostgreSQL: judged up to ``pending_lsn``, recorded in our WAL before ``pending_ours`` — the slot forgets it once
    # that record is on our standbys (``LEGACY_OBSERVE_SLOT_RELEASE``); ``released_lsn``: what the slot was told last.
    pending_lsn = models.CharField(max_length=40, blank=True, default="")
    pending_ours = models.CharField(max_length=40, blank=True, default="")
    released_lsn = models.CharField(max_length=40, blank=True, default="")
    updated_at = models.DateTimeField()


class ObservedRow(models.Model):
    """The polling observer's copy of a legacy row as it last read it (owner, expiry, completion, result): what the
    row's next version is compared with. Written in the same transaction as the judgement of that version."""

    task_id = models.CharField(max_length=200, primary_key=True)
    state = models.JSONField()


class LegacyImport(models.Model):
    """Entering SHADOW over a team's table: its rows made claim.v1 tasks, in batches by key (``last_key``: every row
    up to it imported), then its live claims. Progress for the console and the command line; one running per
    namespace; a killed import resumes from ``last_key``."""

    class Status(models.TextChoices):
        RUNNING = "RUNNING"
        DONE = "DONE"
        FAILED = "FAILED"

    id = models.BigAutoField(primary_key=True)
    namespace = models.CharField(max_length=100)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.RUNNING)
    principal = models.CharField(max_length=200)
    total = models.PositiveBigIntegerField(default=0)  # rows of the namespace when it started
    read = models.PositiveBigIntegerField(default=0)  # rows read so far
    created = models.PositiveBigIntegerField(default=0)  # tasks made (rows claim.v1 already had are not)
    last_key = models.CharField(max_length=200, null=True, blank=True)
    claims = models.JSONField(default=dict)  # the live claims' import: {imported, skipped}
    error = models.TextField(blank=True, default="")
    started_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["namespace"], condition=Q(status="RUNNING"), name="one_legacy_import_running"
            ),
        ]


class WriteBackDifference(models.Model):
    """A rollback's write-back found a row of the legacy table that disagreed with claim.v1 on its completion — an
    old binary completed it directly in V1_WRITES, or completed it with another result — and wrote claim.v1's state
    over it (claim.v1 decided in those stages; docs/adopting.md, "A rollback"). Kept, not silently erased: the
    console lists them with the rollback. Append-only."""

    id = models.BigAutoField(primary_key=True)
    namespace = models.CharField(max_length=100)
    rollback_id = models.UUIDField(null=True, blank=True)
    task_id = models.CharField(max_length=200)
    table = models.JSONField()  # the row as found: {owner_id, completed_by, result}
    claim_v1 = models.JSONField()  # {state, owner_id, result}
    written = models.CharField(max_length=32)  # what the write-back did: CLEARED (not committed) | REPLACED
    at = models.DateTimeField()
