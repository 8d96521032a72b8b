"""Stateless behind a balancer (docs/mcp.md): the multi-host production topology (deploy/topology.py, Debian's
haproxy and PgBouncer in transaction mode, two app servers of two uvicorn processes each), every retry of an agent's
call on a new connection — so on whichever server haproxy picks — and one app server SIGKILLed and restarted in the
middle. Each slot reaches the downstream once (its ledger file, shared by the stdio children of every server), and
every answer of a slot is the same."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from claims.models import Effect
from deploy.topology import AppServer, HAProxy, PgBouncer
from tests.gateway.support import call, counting_downstream, text
from tests.support.actors import make_actor
from tests.support.processes import process_database_url, server_env

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def balanced(tmp_path):
    missing = [
        b for b in ("pgbouncer", "haproxy") if not (shutil.which(b) or Path(f"/usr/sbin/{b}").exists())
    ]
    if missing:
        pytest.skip(f"needs Debian's {' and '.join(missing)}: scripts/install-topology.sh (.ci/run runs it)")
    ledger = tmp_path / "ledger.jsonl"
    direct = process_database_url()
    bouncer = PgBouncer(tmp_path, direct, pool_size=10).start()
    env = server_env(
        DATABASE_URL=bouncer.url_for(direct),
        DATABASE_PGBOUNCER="true",
        DATABASE_LISTEN_URL=direct,
        MCP_DOWNSTREAMS=json.dumps([counting_downstream(ledger, timeout=5)]),
    )
    servers = [AppServer(tmp_path, env, processes=2).start() for _ in range(2)]
    balancer = HAProxy(tmp_path, servers).start()
    parts = {"url": balancer.url, "ledger": ledger, "servers": servers, "env": env, "dir": tmp_path}
    yield parts
    for process in [balancer, *parts["servers"], bouncer]:
        process.stop(10)


def test_retries_through_the_balancer_reach_the_tool_once_per_slot_even_across_a_killed_server(balanced):
    operator, agent = make_actor("olivia-operator", "operator"), make_actor("agent-a", "worker")
    claim = agent.claim(operator.create(node_id="n").json()["task_id"], ttl=120).json()
    answers: dict[str, set[str]] = {}

    def calls(names: list[str]) -> None:
        for name in names:
            for _ in range(3):  # each on a new connection: round robin puts retries on the other server
                answer = call(
                    balanced["url"], agent.token, claim["attempt_id"], "rec__create_record", {"name": name}
                )
                assert not answer.is_error, text(answer)
                answers.setdefault(name, set()).add(text(answer))

    calls([f"before-{i}" for i in range(5)])
    victim = balanced["servers"][0]
    victim.kill()
    restarted = AppServer(balanced["dir"], balanced["env"], port=victim.port, processes=2).start()
    balanced["servers"][0] = restarted
    calls([f"before-{i}" for i in range(5)] + [f"after-{i}" for i in range(5)])

    records = [json.loads(line)["name"] for line in balanced["ledger"].read_text().splitlines()]
    assert sorted(records) == sorted([f"before-{i}" for i in range(5)] + [f"after-{i}" for i in range(5)])
    assert all(len(texts) == 1 for texts in answers.values()), answers
    assert len({json.loads(line)["pid"] for line in balanced["ledger"].read_text().splitlines()}) >= 2
    assert Effect.objects.filter(state="COMMITTED").count() == 10
