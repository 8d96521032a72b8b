import pytest

from tests.gateway.support import _module_gateway, gateway_server, shared_gateway  # noqa: F401 - fixtures


@pytest.fixture
def people(db):
    """An operator who creates tasks and the agent (a worker) who claims them and calls tools."""
    from tests.support.actors import make_actor

    return make_actor("olivia-operator", "operator"), make_actor("agent-a", "worker")
