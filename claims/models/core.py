"""The claim.v1 records.

Constraints here make impossible states unrepresentable in the database itself, not only in code: a CLAIMED
task always names its attempt, owner and lease; a committed task always names its canonical commit; a task has
at most one canonical staged result (a partial unique index); an attempt's generation is unique per task.

Only ``claims/services.py`` writes these rows.
"""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import F, Q


class Namespace(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    scheduler_epoch = models.PositiveBigIntegerField(default=1)
    claims_paused = models.BooleanField(default=False)
    # Who alone may lift the pause ("rollback:<id>"), or "": while it is set, resume is refused (PAUSE_HELD).
    pause_hold = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(scheduler_epoch__gte=1), name="namespace_epoch_from_1"),
        ]

    def __str__(self) -> str:
        return self.name


class TaskState(models.TextChoices):
    BLOCKED = "BLOCKED"
    READY = "READY"
    CLAIMED = "CLAIMED"
    COMMITTED = "COMMITTED"
    CANCELLED = "CANCELLED"


class ReplayPolicy(models.TextChoices):
    REPLAYABLE = "REPLAYABLE"
    NON_REPLAYABLE = "NON_REPLAYABLE"


# States in which no claim is held: the claim fields must be empty.
_UNHELD = [TaskState.BLOCKED, TaskState.READY, TaskState.CANCELLED]


class Task(models.Model):
    task_id = models.CharField(max_length=200, primary_key=True)
    # Indexed as the first column of task_ns_created (and the frontier's): an index of its own would only be one
    # more entry for every claim and commit to write (every task update is non-HOT), never read.
    namespace = models.ForeignKey(Namespace, on_delete=models.PROTECT, related_name="tasks", db_index=False)
    node_id = models.CharField(max_length=200)
    input = models.JSONField()
    input_digest = models.CharField(max_length=71)
    # Kept in creation order for the API; the join table below is what the database queries.
    depends_on = models.JSONField(default=list)
    replay_policy = models.CharField(
        max_length=16, choices=ReplayPolicy.choices, default=ReplayPolicy.REPLAYABLE
    )
    resources = models.JSONField(default=list)
    # Set when a task that waits on this one is created: a commit looks for successors only when there are some.
    has_successors = models.BooleanField(default=False)
    # The task lists resources: only then does claim-next ask whether another task holds one.
    has_resources = models.BooleanField(default=False)

    state = models.CharField(max_length=16, choices=TaskState.choices)
    state_version = models.PositiveBigIntegerField(default=1)
    # The epoch the current claim was granted under (0 before the first claim).
    scheduler_epoch = models.PositiveBigIntegerField(default=0)
    claim_generation = models.PositiveBigIntegerField(default=0)
    attempt_id = models.UUIDField(null=True, blank=True)
    owner_id = models.CharField(max_length=200, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    cancel_generation = models.PositiveBigIntegerField(default=0)

    result_commit_id = models.UUIDField(null=True, blank=True, unique=True)
    result_digest = models.CharField(max_length=71, null=True, blank=True)
    result = models.JSONField(null=True, blank=True)

    # claim-v1.md §10: 1 is granted first. ``fairness_key`` shares grants within a priority by the key's weight;
    # ``vtag`` is the task's place in that share — its virtual start time, stamped by ``services.fair_share`` when
    # the task is created or its priority changes (docs/architecture.md, "Priority and fair share").
    # Defaults in the database too: a row written by SQL of its own (a bench's seed) is a task of the default lane.
    priority = models.PositiveSmallIntegerField(default=3, db_default=3)
    fairness_key = models.CharField(max_length=64, blank=True, default="", db_default="")
    fairness_weight = models.FloatField(
        default=1.0, db_default=1.0
    )  # the key's weight when the task took its place
    vtag = models.FloatField(default=0.0, db_default=0.0)

    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        indexes = [
            # The frontier, in grant order: claims walk a namespace's READY tasks by priority, then place in the
            # fair share (oldest first within a key; with one key, oldest first).
            models.Index(
                fields=["namespace", "priority", "vtag", "task_id"],
                condition=Q(state="READY"),
                name="task_ready_order",
            ),
            # Each fairness key's READY tasks, in its order: what /metrics and the namespace pages count a key's
            # backlog from (claims.queues), a bounded range a key. An entry for each task made READY (created,
            # released, requeued); a claim or a commit adds none (the task leaves READY).
            models.Index(
                fields=["namespace", "priority", "fairness_key", "vtag"],
                condition=Q(state="READY"),
                name="task_ready_key",
            ),
            # Reclaim candidates: claimed tasks whose lease ran out or whose epoch is old. A claim asks whether one
            # outranks the READY task it would take (statements._priority_bound): the claims in flight, by either.
            models.Index(
                fields=["namespace", "lease_expires_at"],
                condition=Q(state="CLAIMED"),
                name="task_claimed_lease",
            ),
            models.Index(
                fields=["namespace", "scheduler_epoch"],
                condition=Q(state="CLAIMED"),
                name="task_claimed_epoch",
            ),
            # The list, oldest first (claim-v1.md §3), read in index order so a page stops after a page whatever
            # the history: all tasks, or a namespace's; and the tasks not committed — sparse among old ones, and
            # only their row versions are indexed, so a commit adds no entry — for a list by any other state.
            # Every task update is a non-HOT update (its state changes), so each index here costs every claim and
            # commit an entry: docs/benchmarks.md has the cost measured.
            models.Index(fields=["created_at", "task_id"], name="task_created"),
            models.Index(fields=["namespace", "created_at", "task_id"], name="task_ns_created"),
            models.Index(
                fields=["created_at", "task_id"], condition=~Q(state="COMMITTED"), name="task_open_created"
            ),
            models.Index(
                fields=["namespace", "created_at", "task_id"],
                condition=~Q(state="COMMITTED"),
                name="task_open_ns_created",
            ),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(state__in=TaskState.values), name="task_state_valid"),
            models.CheckConstraint(
                condition=Q(priority__gte=1, priority__lte=5), name="task_priority_1_to_5"
            ),
            models.CheckConstraint(
                condition=Q(replay_policy__in=ReplayPolicy.values), name="task_replay_valid"
            ),
            models.CheckConstraint(
                condition=~Q(state=TaskState.CLAIMED)
                | Q(attempt_id__isnull=False, owner_id__isnull=False, lease_expires_at__isnull=False),
                name="task_claimed_has_claim",
            ),
            models.CheckConstraint(
                condition=~Q(state__in=_UNHELD)
                | Q(attempt_id__isnull=True, owner_id__isnull=True, lease_expires_at__isnull=True),
                name="task_unheld_has_no_claim",
            ),
            models.CheckConstraint(
                condition=~Q(state=TaskState.COMMITTED)
                | Q(result_commit_id__isnull=False, result_digest__isnull=False, attempt_id__isnull=False),
                name="task_committed_has_commit",
            ),
            models.CheckConstraint(
                condition=Q(state=TaskState.COMMITTED)
                | Q(result_commit_id__isnull=True, result_digest__isnull=True),
                name="task_commit_only_when_committed",
            ),
            models.CheckConstraint(
                condition=Q(claim_generation=0) | Q(scheduler_epoch__gte=1), name="task_claim_has_epoch"
            ),
        ]

    def __str__(self) -> str:
        return self.task_id


class TaskDependency(models.Model):
    """task waits on depends_on. Successors are found by depends_on; both ends live in one namespace."""

    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="dependency_links")
    depends_on = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="successor_links")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "depends_on"], name="task_dependency_once"),
            models.CheckConstraint(condition=~Q(task=F("depends_on")), name="task_dependency_not_self"),
        ]


class AttemptEnd(models.TextChoices):
    COMMITTED = "COMMITTED"
    RELEASED = "RELEASED"
    RECLAIMED = "RECLAIMED"  # another owner claimed after this lease expired
    FENCED = (
        "FENCED"  # an epoch fence ended it (marked by the fence; the epoch rule does not depend on the mark)
    )
    CANCELLED = "CANCELLED"


class Attempt(models.Model):
    """One claim of a task by one owner. Never reused; ``ended_at`` is set once."""

    attempt_id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    # Both indexed as the first column of a composite (attempt_generation_once, attempt_ns_live): no index of their
    # own, one entry fewer per claim and per attempt end each.
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="attempts", db_index=False)
    namespace = models.ForeignKey(Namespace, on_delete=models.PROTECT, related_name="+", db_index=False)
    owner_id = models.CharField(max_length=200)
    pool = models.CharField(max_length=100, blank=True, default="")
    claim_generation = models.PositiveBigIntegerField()
    scheduler_epoch = models.PositiveBigIntegerField()  # granted under
    cancel_generation = models.PositiveBigIntegerField()  # current when granted
    input_digest = models.CharField(max_length=71)  # current when granted
    # {resource_key: {"incarnation": uuid|None, "token": int}}: the fence this claim took at each resource.
    fences = models.JSONField(default=dict)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=16, choices=AttemptEnd.choices, null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["task", "claim_generation"], name="attempt_generation_once"),
            models.CheckConstraint(condition=Q(claim_generation__gte=1), name="attempt_generation_from_1"),
            models.CheckConstraint(
                condition=Q(ended_at__isnull=True, end_reason__isnull=True)
                | Q(ended_at__isnull=False, end_reason__in=AttemptEnd.values),
                name="attempt_end_complete",
            ),
        ]
        # The metrics fold reads attempt ends by time through this too, one range per namespace (tallies.py).
        indexes = [models.Index(fields=["namespace", "ended_at"], name="attempt_ns_live")]


class StagedResult(models.Model):
    """A result an attempt computed. Isolated until a commit makes it the task's one canonical result."""

    staged_result_id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    task = models.ForeignKey(Task, on_delete=models.PROTECT, related_name="staged_results", db_index=False)
    # No database constraint: retention deletes a finished task's attempts and keeps its canonical result — the
    # record of what was committed, which a repeat of the commit answers from (services/retention.py).
    attempt = models.ForeignKey(
        Attempt,
        on_delete=models.DO_NOTHING,
        related_name="staged_results",
        db_constraint=False,
        db_index=False,  # the first column of staged_once_per_attempt_digest
    )
    result = models.JSONField()
    result_digest = models.CharField(max_length=71)
    staged_at = models.DateTimeField()
    canonical = models.BooleanField(default=False)
    commit_id = models.UUIDField(null=True, blank=True, unique=True)
    committed_at = models.DateTimeField(null=True, blank=True)
    # The successors this commit released: part of the stored 200 body an idempotent repeat returns.
    unblocked = models.JSONField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["attempt", "result_digest"], name="staged_once_per_attempt_digest"
            ),
            # At most one canonical commit per task, ever: enforced here, not only by the service.
            models.UniqueConstraint(
                fields=["task"], condition=Q(canonical=True), name="one_canonical_commit_per_task"
            ),
            models.CheckConstraint(
                condition=Q(canonical=False, commit_id__isnull=True, committed_at__isnull=True)
                | Q(
                    canonical=True,
                    commit_id__isnull=False,
                    committed_at__isnull=False,
                    unblocked__isnull=False,
                ),
                name="staged_canonical_complete",
            ),
        ]
        # A task's staged rows (the commit's NOT_STAGED search, a repeat, retention): a plain btree, without the LIKE
        # index PostgreSQL would add to a text foreign key's own.
        indexes = [models.Index(fields=["task"], name="staged_task")]


class EventKind(models.TextChoices):
    TASK_CREATED = "task_created"
    CLAIMED = "claimed"
    RECLAIMED = "reclaimed"
    RENEWED = "renewed"
    RELEASED = "released"
    LEASE_EXPIRED = "lease_expired"
    EFFECT_PREPARED = "effect_prepared"
    EFFECT_UNKNOWN = "effect_unknown"
    EFFECT_COMMITTED = "effect_committed"
    EFFECT_FAILED = "effect_failed"
    EFFECT_RECONCILED = "effect_reconciled"
    EFFECT_APPROVED = "effect_approved"
    DISPATCH_RECORDED = "dispatch_recorded"
    RESULT_STAGED = "result_staged"
    RESULT_COMMITTED = "result_committed"
    UNBLOCKED = "unblocked"
    FENCED = "fenced"
    CANCELLED = "cancelled"
    REQUEUED = "requeued"
    INPUT_REVISED = "input_revised"
    EPOCH_FENCED = "epoch_fenced"
    PRIORITY_CHANGED = "priority_changed"


class AcceptancePoint(models.TextChoices):
    CLAIM = "claim"
    RENEW = "renew"
    RELEASE = "release"
    EFFECT = "effect"
    COMMIT = "commit"


class TaskEvent(models.Model):
    """The append-only timeline. Written in the transaction of the change it describes (a rejection: in its
    own small transaction). Never updated. ``point`` marks one row per request that reached an acceptance point;
    ``via`` names the protocol a request arrived through when another app passed it on (``services.acting_via``;
    the rollout's mirrored legacy operations are ``"legacy"``), "" for a claim.v1 request of its own."""

    id = models.BigAutoField(primary_key=True)
    # Both indexed as the first column of a composite below (event_ns_point_at, event_task_timeline): three events a
    # task, each would write two (the task's three, with PostgreSQL's LIKE index) entries more.
    namespace = models.ForeignKey(
        Namespace, on_delete=models.PROTECT, related_name="+", db_constraint=False, db_index=False
    )
    task = models.ForeignKey(
        Task,
        on_delete=models.PROTECT,
        related_name="events",
        null=True,
        blank=True,
        db_constraint=False,
        db_index=False,
    )
    kind = models.CharField(max_length=24, choices=EventKind.choices)
    at = models.DateTimeField()
    attempt_id = models.UUIDField(null=True, blank=True)
    claim_generation = models.PositiveBigIntegerField(null=True, blank=True)
    scheduler_epoch = models.PositiveBigIntegerField(null=True, blank=True)
    owner_id = models.CharField(max_length=200, null=True, blank=True)
    principal = models.CharField(max_length=200, blank=True, default="")
    point = models.CharField(max_length=8, choices=AcceptancePoint.choices, null=True, blank=True)
    via = models.CharField(max_length=16, blank=True, default="")
    detail = models.JSONField(default=dict)

    class Meta:
        indexes = [
            models.Index(fields=["task", "id"], name="event_task_timeline"),
            models.Index(fields=["namespace", "point", "at"], name="event_ns_point_at"),
            # /metrics' unfolded stretch and the fold (tallies.figures), and retention's oldest-first batches.
            models.Index(fields=["at"], name="event_at"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(kind__in=EventKind.values), name="event_kind_valid"),
            models.CheckConstraint(
                condition=Q(point__isnull=True) | Q(point__in=AcceptancePoint.values),
                name="event_point_valid",
            ),
        ]


class Role(models.TextChoices):
    WORKER = "worker"
    # Reads what a reviewer needs and reviews and explains shadow mismatches; moves no stage, fences nothing.
    REVIEWER = "reviewer"
    OPERATOR = "operator"
    ONCALL = "oncall"


class Principal(models.Model):
    """Who calls the API. A worker's name is its owner_id: it can act only as itself."""

    name = models.CharField(max_length=200, unique=True)
    role = models.CharField(max_length=16, choices=Role.choices)
    pool = models.CharField(max_length=100, blank=True, default="")
    created_at = models.DateTimeField()

    class Meta:
        constraints = [models.CheckConstraint(condition=Q(role__in=Role.values), name="principal_role_valid")]

    # DRF treats request.user as the authenticated party.
    is_authenticated = True
    is_anonymous = False

    @property
    def owner_id(self) -> str:
        return self.name

    def __str__(self) -> str:
        return f"{self.name} ({self.role})"


class Token(models.Model):
    """A bearer token, stored only as its SHA-256 (tokens carry 256 bits of randomness, so a fast hash
    suffices: there is nothing to brute-force). ``prefix`` lets an operator tell tokens apart."""

    principal = models.ForeignKey(Principal, on_delete=models.CASCADE, related_name="tokens")
    key_hash = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    created_at = models.DateTimeField()
    revoked_at = models.DateTimeField(null=True, blank=True)


class AuditEntry(models.Model):
    """Append-only log of every operator and on-call action, with its principal."""

    id = models.BigAutoField(primary_key=True)
    at = models.DateTimeField()
    principal = models.CharField(max_length=200)
    role = models.CharField(max_length=16)
    action = models.CharField(max_length=64)
    namespace = models.CharField(max_length=100, blank=True, default="")
    target = models.CharField(max_length=200, blank=True, default="")
    reason = models.TextField(blank=True, default="")
    detail = models.JSONField(default=dict)

    class Meta:
        indexes = [
            models.Index(fields=["at"], name="audit_at"),
            # an epoch fence looks for its own id (target "fence:<id>") under the namespace row lock: keep it quick
            models.Index(fields=["action", "target"], name="audit_action_target"),
        ]
