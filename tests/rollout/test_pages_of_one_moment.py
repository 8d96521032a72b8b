"""A console page is read at one moment (issue 36): the rollout page is built from a dozen queries, and a rollback
that ended between two of them once left it showing the old stage beside the finished rollback — with "Advance to
V1_ONLY…" offered. Proven at the boundary: the page is paused after it read the stage, a rollback commits, then
the page goes on. It must show the namespace as it was before the rollback or as it is after, never a mix."""

from __future__ import annotations

import pytest

from rollout.models import Rollback
from tests.support.actors import make_actor
from tests.support.console import login
from tests.support.races import Pause, run_in_thread

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def test_a_rollback_ending_while_the_rollout_page_is_read_shows_before_or_after_never_both():
    operator, oncall = make_actor("olivia-operator", "operator"), make_actor("oscar-oncall", "oncall")
    assert operator.post("/namespaces", {"name": "moment", "stage": "V1_WRITES"}).status_code == 201
    viewer = login("viewer")
    pause = Pause("rollout_page.stage_read")

    reading, box = run_in_thread(lambda: viewer.get("/ns/moment/", {"part": "live"}))
    pause.wait_reached()  # the page has read the stage: V1_WRITES
    rolled = oncall.post("/namespaces/moment/rollout/rollback", {"to_stage": "V1_READS", "reason": "drill"})
    pause.resume()
    reading.join(30)

    assert rolled.status_code == 200 and Rollback.objects.get().finished_at is not None  # it ended at once
    assert "error" not in box, box
    page = box["value"]
    assert page.status_code == 200
    shown = page.context["stage"], page.context["rollback"], page.context["next_stage"]
    before = ("V1_WRITES", None, "V1_ONLY")
    assert shown == before or (shown[0], shown[2]) == ("V1_READS", "V1_WRITES"), shown
    html = page.content.decode()
    assert not ("Advance to V1_ONLY" in html and "Last rollback" in html), "the old stage beside the rollback"
