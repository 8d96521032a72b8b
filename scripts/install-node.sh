#!/usr/bin/env bash
# Node.js and npm for the TypeScript client's tests (clients/typescript): Debian's packages, when they are missing.
set -euo pipefail
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "node/npm missing and not root: the TypeScript client's test will be skipped" >&2
  exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
