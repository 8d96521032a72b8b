"""A property-based stateful test (Hypothesis) of the claim and effect services against a small model of the
contract: random claims, expiries, renewals, releases, commits, cancels, input revisions, epoch fences and
effect calls by three workers. After every step the service's answer must be the one the model predicts, and the
records must hold the invariants: one canonical commit per task at most, generations never go back, the
canonical result was computed on the input current at commit, an effect's payload never changes once bound."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from claims import clock, services
from claims.digest import digest
from claims.errors import Conflict
from claims.models import Effect, Principal, Role, StagedResult, Task

WORKERS = ["w0", "w1", "w2"]


@dataclass
class Held:
    attempt_id: uuid.UUID
    owner: str
    generation: int
    epoch: int
    cancel_generation: int
    input_digest: str
    deadline: float  # model seconds


@dataclass
class TaskModel:
    task_id: str
    input_digest: str
    state: str = "READY"
    generation: int = 0
    cancel_generation: int = 0
    held: Held | None = None
    committed_digest: str | None = None
    attempts: list[Held] = field(default_factory=list)


class ClaimsMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self):
        clock.reset()
        clock.freeze()  # the model's time and the database's move together, only by travel()
        self.now = 0.0
        self.namespace = f"sm-{uuid.uuid4().hex[:10]}"
        self.operator = Principal.objects.get_or_create(
            name="sm-operator", defaults={"role": Role.ONCALL, "created_at": clock.now()}
        )[0]
        self.workers = {
            name: Principal.objects.get_or_create(
                name=name, defaults={"role": Role.WORKER, "created_at": clock.now()}
            )[0]
            for name in WORKERS
        }
        services.namespace_create(principal=self.operator, name=self.namespace)
        self.epoch, self.paused = 1, False
        self.tasks: list[TaskModel] = []
        self.bound: dict[str, str] = {}
        self.max_generation: dict[str, int] = {}
        for value in (0, 1):  # start with work to do, so short runs still reach claims and races
            self.create(value)

    # --- helpers ---
    def _live(self, model: TaskModel) -> bool:
        h = model.held
        return model.state == "CLAIMED" and h is not None and h.epoch == self.epoch and h.deadline > self.now

    def _advance(self, seconds: float) -> None:
        clock.travel(seconds)
        self.now += seconds

    # --- rules ---
    @rule(value=st.integers(0, 3))
    def create_task(self, value):
        self.create(value)

    def create(self, value):
        if len(self.tasks) >= 4:
            return
        task = services.task_create(
            principal=self.operator, namespace=self.namespace, node_id="n", input={"v": value}
        ).task
        self.tasks.append(TaskModel(task.task_id, digest({"v": value})))

    @rule(data=st.data(), worker=st.sampled_from(WORKERS), ttl=st.integers(2, 10))
    def claim(self, data, worker, ttl):
        if not self.tasks:
            return
        model = data.draw(st.sampled_from(self.tasks))
        claimable = model.state == "READY" or (model.state == "CLAIMED" and not self._live(model))
        expected = not self.paused and claimable
        try:
            grant = services.task_claim(
                principal=self.workers[worker],
                task_id=model.task_id,
                owner_id=worker,
                scheduler_epoch=self.epoch,
                ttl_seconds=ttl,
            )
        except Conflict as exc:
            assert not expected, f"claim refused unexpectedly: {exc.outcome} {exc.reason}"
            return
        assert expected, "claim granted though the model says it must be refused"
        model.generation += 1
        assert grant.task.claim_generation == model.generation
        model.state = "CLAIMED"
        model.held = Held(
            grant.attempt_id,
            worker,
            model.generation,
            self.epoch,
            model.cancel_generation,
            model.input_digest,
            self.now + ttl,
        )
        model.attempts.append(model.held)

    @rule(seconds=st.sampled_from([1, 3, 11]))
    def time_passes(self, seconds):
        self._advance(seconds)

    @rule(data=st.data(), extend=st.integers(2, 10), current=st.booleans())
    def renew(self, data, extend, current):
        # Half the time the current holder (often just past its lease), half any attempt ever granted (stale).
        attempts = [(m, m.held) for m in self.tasks if m.held] if current else []
        attempts = attempts or [(m, a) for m in self.tasks for a in m.attempts]
        if not attempts:
            return
        model, attempt = data.draw(st.sampled_from(attempts))
        expected = (
            model.state == "CLAIMED"
            and model.held is attempt
            and attempt.epoch == self.epoch
            and attempt.deadline > self.now
            and attempt.cancel_generation == model.cancel_generation
        )
        try:
            services.task_renew(
                principal=self.workers[attempt.owner],
                task_id=model.task_id,
                attempt_id=attempt.attempt_id,
                claim_generation=attempt.generation,
                owner_id=attempt.owner,
                scheduler_epoch=self.epoch,
                cancel_generation=attempt.cancel_generation,
                extend_seconds=extend,
            )
        except Conflict as exc:
            assert not expected, f"renew refused unexpectedly: {exc.outcome} {exc.reason}"
            return
        assert expected, "renew accepted for an attempt that is not current and live"
        attempt.deadline = self.now + extend

    @rule(data=st.data(), result=st.integers(0, 2), current=st.booleans())
    def commit(self, data, result, current):
        attempts = [(m, m.held) for m in self.tasks if m.held] if current else []
        attempts = attempts or [(m, a) for m in self.tasks for a in m.attempts]
        if not attempts:
            return
        model, attempt = data.draw(st.sampled_from(attempts))
        value = {"r": result, "on": attempt.input_digest}
        services.result_stage(
            principal=self.workers[attempt.owner],
            task_id=model.task_id,
            attempt_id=attempt.attempt_id,
            claim_generation=attempt.generation,
            result=value,
            result_digest=digest(value),
        )
        repeat = (
            model.state == "COMMITTED" and model.held is attempt and model.committed_digest == digest(value)
        )
        expected = repeat or (
            model.state == "CLAIMED"
            and model.held is attempt
            and attempt.epoch == self.epoch
            and attempt.deadline > self.now
            and attempt.input_digest == model.input_digest
            and attempt.cancel_generation == model.cancel_generation
        )
        try:
            services.task_commit(
                principal=self.workers[attempt.owner],
                task_id=model.task_id,
                attempt_id=attempt.attempt_id,
                scheduler_epoch=self.epoch,
                claim_generation=attempt.generation,
                observed_cancel_generation=attempt.cancel_generation,
                input_digest=attempt.input_digest,
                result_digest=digest(value),
            )
        except Conflict as exc:
            assert not expected, f"commit refused unexpectedly: {exc.outcome} {exc.reason}"
            return
        assert expected, "commit accepted though the model says it must be fenced"
        model.state, model.committed_digest = "COMMITTED", digest(value)

    @rule(data=st.data())
    def release(self, data):
        attempts = [(m, a) for m in self.tasks for a in m.attempts]
        if not attempts:
            return
        model, attempt = data.draw(st.sampled_from(attempts))
        expected = model.state == "CLAIMED" and model.held is attempt and attempt.epoch == self.epoch
        try:
            services.task_release(
                principal=self.workers[attempt.owner],
                task_id=model.task_id,
                attempt_id=attempt.attempt_id,
                claim_generation=attempt.generation,
                owner_id=attempt.owner,
                scheduler_epoch=self.epoch,
            )
        except Conflict:
            assert not expected
            return
        assert expected
        model.state, model.held = "READY", None

    @rule(data=st.data())
    def cancel(self, data):
        if not self.tasks:
            return
        model = data.draw(st.sampled_from(self.tasks))
        try:
            services.task_cancel(principal=self.operator, task_id=model.task_id, reason="sm")
        except Conflict:
            assert model.state == "COMMITTED"
            return
        if model.state != "CANCELLED":
            model.cancel_generation += 1
        model.state, model.held = "CANCELLED", None

    @rule(data=st.data(), value=st.integers(4, 6))
    def revise(self, data, value):
        if not self.tasks:
            return
        model = data.draw(st.sampled_from(self.tasks))
        try:
            services.task_revise_input(principal=self.operator, task_id=model.task_id, input={"v": value})
        except Conflict:
            assert model.state in ("COMMITTED", "CANCELLED")
            return
        model.input_digest = digest({"v": value})

    @rule()
    def fence_and_resume(self):
        services.epoch_fence(principal=self.operator, namespace=self.namespace, reason="sm")
        self.epoch += 1
        services.namespace_resume(principal=self.operator, namespace=self.namespace)

    @rule(data=st.data(), payload=st.integers(0, 1))
    def prepare_effect(self, data, payload):
        live = [m for m in self.tasks if self._live(m)]
        if not live:
            return
        model = data.draw(st.sampled_from(live))
        held = model.held
        try:
            prepared = services.effect_prepare(
                principal=self.workers[held.owner],
                task_id=model.task_id,
                effect_slot="s",
                payload_digest=digest(payload),
                attempt_id=held.attempt_id,
                claim_generation=held.generation,
                scheduler_epoch=self.epoch,
                owner_id=held.owner,
            )
        except Conflict as exc:
            assert exc.outcome == "PAYLOAD_CONFLICT" and self.bound.get(model.task_id) != digest(payload)
            return
        self.bound.setdefault(model.task_id, digest(payload))
        assert prepared.effect.payload_digest == self.bound[model.task_id]

    # --- invariants over the records ---
    @invariant()
    def records_agree_with_the_model(self):
        if not hasattr(self, "tasks"):
            return
        for model in self.tasks:
            row = Task.objects.get(pk=model.task_id)
            assert row.claim_generation == model.generation
            assert row.claim_generation >= self.max_generation.get(model.task_id, 0)
            self.max_generation[model.task_id] = row.claim_generation
            assert StagedResult.objects.filter(task_id=model.task_id, canonical=True).count() <= 1
            assert (row.state == "COMMITTED") == (model.state == "COMMITTED")
            if row.state == "COMMITTED":
                assert row.result_digest == model.committed_digest
                # computed on the input current at commit
                assert row.result["on"] == Task.objects.get(pk=model.task_id).input_digest
            effect = Effect.objects.filter(task_id=model.task_id).first()
            if effect is not None:
                assert effect.payload_digest == self.bound[model.task_id]


EXAMPLES = int(os.environ.get("STATEFUL_EXAMPLES", "60"))


@pytest.mark.django_db
@pytest.mark.timeout(
    120 + EXAMPLES
)  # a long run (STATEFUL_EXAMPLES=2000) outlasts the suite's 120 s per test
def test_the_services_follow_the_contracts_model():
    from hypothesis.stateful import run_state_machine_as_test

    clock.reset()
    clock.freeze()  # the model's time and the database's move together, only by travel()
    try:
        run_state_machine_as_test(
            ClaimsMachine,
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=40,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            ),
        )
    finally:
        clock.reset()
