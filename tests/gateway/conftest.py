from tests.gateway.support import _module_gateway, gateway_server, shared_gateway  # noqa: F401 - fixtures
