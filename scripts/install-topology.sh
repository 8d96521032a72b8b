#!/usr/bin/env bash
# The production pieces the deployment tests start (deploy/topology.py), from Debian's packages: PgBouncer, haproxy,
# and promtool (package prometheus) for the alert rules. Idempotent: does nothing when all three are there.
set -euo pipefail
if command -v pgbouncer >/dev/null && command -v haproxy >/dev/null && command -v promtool >/dev/null; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-topology: needs root to apt-get install pgbouncer haproxy prometheus" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends pgbouncer haproxy prometheus >/dev/null
# Debian starts the packaged services; the tests run their own instances on their own ports.
for service in pgbouncer haproxy prometheus; do
  (service "$service" stop || true) >/dev/null 2>&1
done
pgbouncer --version | head -1
