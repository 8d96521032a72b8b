"""The gateway in front of real reference MCP servers — npm's filesystem and memory servers and PyPI's git server —
called by the official TypeScript SDK's client (and Python's), with retries on new connections. What is counted is
the downstream system itself: the files on disk, the memory server's graph, the git log."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from claims.models import Effect
from tests.gateway.support import NODE, NODE_DIR, call, outcome, text
from tests.support.actors import make_actor

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not NODE.exists(), reason="needs scripts/install-mcp-servers.sh (npm's reference servers)"
    ),
]

BIN = NODE_DIR / "node_modules/.bin"


def _ts_agent(endpoint: str, token: str, tool: str, arguments: dict, times: int = 1) -> list[dict]:
    done = subprocess.run(
        [str(NODE), str(NODE_DIR / "agent.mjs"), endpoint, token, tool, json.dumps(arguments), str(times)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=NODE_DIR,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


@pytest.fixture
def agent_claim(db):
    operator, agent = make_actor("olivia-operator", "operator"), make_actor("ts-agent", "worker")
    claim = agent.claim(operator.create(node_id="tidy-files").json()["task_id"], ttl=120).json()
    return agent, claim


def test_filesystem_moves_and_writes_happen_once_under_retries_from_the_typescript_client(
    gateway_server, agent_claim, tmp_path
):
    """``move_file`` fails when repeated (the source is gone): a naive retry answers an error for an action that
    succeeded. Through the gateway the retry gets the first answer, and the file was moved once."""
    root = tmp_path / "data"
    root.mkdir()
    (root / "draft.txt").write_text("v1")
    files = {
        "name": "files",
        "prefix": "fs",
        "command": [str(NODE), str(BIN / "mcp-server-filesystem"), str(root)],
    }
    rules = [
        {
            "downstream": "files",
            "tool": "write_file",
            "slot_from": "ARGUMENT",
            "slot_argument": "path",
            "query_tool": "read_text_file",
            "query_arguments": {"path": "$path"},
            "occurred_if": "TEXT_CONTAINS",
            "occurred_text": "$content",
        }
    ]
    gw = gateway_server(downstreams=[files], rules=rules, timeout=10)
    agent, claim = agent_claim
    endpoint = f"{gw.url}/mcp/attempts/{claim['attempt_id']}"

    listed = _ts_agent(endpoint, agent.token, "--list", {})[0]
    moves = _ts_agent(
        endpoint,
        agent.token,
        "fs__move_file",
        {"source": str(root / "draft.txt"), "destination": str(root / "final.txt")},
        times=3,
    )
    writes = _ts_agent(
        endpoint, agent.token, "fs__write_file", {"path": str(root / "log.txt"), "content": "moved"}, times=2
    )
    changed = _ts_agent(
        endpoint, agent.token, "fs__write_file", {"path": str(root / "log.txt"), "content": "again"}
    )[0]

    assert {"fs__move_file", "fs__write_file", "fs__read_text_file"} <= {t["name"] for t in listed}
    assert [m.get("isError", False) for m in moves] == [False, False, False]
    assert len({json.dumps(m["content"]) for m in moves}) == 1
    assert moves[1]["_meta"]["dev.claim-control-plane/replayed"] is True
    assert not (root / "draft.txt").exists() and (root / "final.txt").read_text() == "v1"
    assert [w.get("isError", False) for w in writes] == [False, False] and (
        root / "log.txt"
    ).read_text() == "moved"
    assert changed["isError"] is True and changed["structuredContent"]["outcome"] == "PAYLOAD_CONFLICT"
    assert Effect.objects.filter(state="COMMITTED").count() == 2


def test_memory_entities_are_created_once_when_two_agents_retry(gateway_server, agent_claim, tmp_path):
    memory_file = tmp_path / "memory.jsonl"
    memory = {
        "name": "memory",
        "prefix": "mem",
        "command": [str(NODE), str(BIN / "mcp-server-memory")],
        "env": {"MEMORY_FILE_PATH": str(memory_file)},
    }
    gw = gateway_server(downstreams=[memory], timeout=10)
    agent, claim = agent_claim
    endpoint = f"{gw.url}/mcp/attempts/{claim['attempt_id']}"
    entity = {
        "entities": [{"name": "ticket-42", "entityType": "ticket", "observations": ["printer on fire"]}]
    }
    observation = {"observations": [{"entityName": "ticket-42", "contents": ["escalated"]}]}

    _ts_agent(endpoint, agent.token, "mem__create_entities", entity, times=2)
    python_retry = call(gw.url, agent.token, claim["attempt_id"], "mem__create_entities", entity)
    _ts_agent(endpoint, agent.token, "mem__add_observations", observation, times=2)

    assert not python_retry.is_error
    lines = [json.loads(line) for line in memory_file.read_text().splitlines() if line.strip()]
    tickets = [line for line in lines if line.get("name") == "ticket-42"]
    assert len(tickets) == 1 and tickets[0]["observations"] == ["printer on fire", "escalated"]


@pytest.mark.skipif(not shutil.which("git"), reason="needs git")
def test_a_git_commit_is_made_once_when_the_call_is_retried(gateway_server, agent_claim, tmp_path):
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for key, value in (("user.name", "agent"), ("user.email", "agent@example.org")):
        subprocess.run(["git", "-C", str(repo), "config", key, value], check=True)
    (repo / "notes.md").write_text("done\n")
    subprocess.run(["git", "-C", str(repo), "add", "notes.md"], check=True)
    git = {"name": "git", "prefix": "git", "command": [str(Path(sys.executable).parent / "mcp-server-git")]}
    gw = gateway_server(downstreams=[git], timeout=15)
    agent, claim = agent_claim
    endpoint = f"{gw.url}/mcp/attempts/{claim['attempt_id']}"
    args = {"repo_path": str(repo), "message": "agent: notes"}

    answers = _ts_agent(endpoint, agent.token, "git__git_commit", args, times=3)

    assert [a.get("isError", False) for a in answers] == [False] * 3
    log = subprocess.run(["git", "-C", str(repo), "log", "--oneline"], capture_output=True, text=True).stdout
    assert log.count("agent: notes") == 1, log
    fenced_by_nobody = call(gw.url, agent.token, claim["attempt_id"], "git__git_commit", args)
    assert outcome(fenced_by_nobody) is None and text(fenced_by_nobody) == answers[0]["content"][0]["text"]
