from tests.gateway.support import gateway_server  # noqa: F401 - the fixture
