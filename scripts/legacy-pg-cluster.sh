#!/usr/bin/env bash
# A team's own PostgreSQL for the legacy table's observe mode (docs/adopting.md): a cluster of its own on port 5433
# with wal_level = logical (logical decoding needs it, and it takes a restart — the shared cluster on 5432 stays as
# it is). Debian's pg_createcluster; trust on 127.0.0.1 like the shared one. Idempotent: creates, configures and
# starts only what is missing. Needs root (CI runs as root).
set -euo pipefail
PORT="${LEGACY_PG_PORT:-5433}"
VERSION="$(ls /etc/postgresql | sort -n | tail -1)"
if [ ! -d "/etc/postgresql/$VERSION/legacy" ]; then
  pg_createcluster "$VERSION" legacy -p "$PORT" >/dev/null
fi
CONF="/etc/postgresql/$VERSION/legacy"
if ! grep -q "^wal_level = logical" "$CONF/postgresql.conf"; then
  {
    echo "wal_level = logical"
    echo "max_replication_slots = 10"
    echo "max_wal_senders = 10"
    echo "max_slot_wal_keep_size = 1GB"
  } >> "$CONF/postgresql.conf"
fi
if ! grep -q "^host all all 127.0.0.1/32 trust" "$CONF/pg_hba.conf"; then
  sed -i 's/^\(host\|local\)\(.*\)\(scram-sha-256\|md5\|peer\)$/\1\2trust/' "$CONF/pg_hba.conf"
  echo "host all all 127.0.0.1/32 trust" >> "$CONF/pg_hba.conf"
fi
if ! pg_isready -q -h 127.0.0.1 -p "$PORT"; then
  pg_ctlcluster --skip-systemctl-redirect "$VERSION" legacy restart >/dev/null 2>&1 \
    || pg_ctlcluster --skip-systemctl-redirect "$VERSION" legacy start
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p "$PORT" && break; sleep 1; done
fi
if ! psql -h 127.0.0.1 -p "$PORT" -U postgres -Atc "SHOW wal_level" | grep -qx logical; then
  pg_ctlcluster --skip-systemctl-redirect "$VERSION" legacy restart  # the setting was added while it ran
  for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p "$PORT" && break; sleep 1; done
fi
psql -h 127.0.0.1 -p "$PORT" -U postgres -Atc "SHOW wal_level" | grep -qx logical
