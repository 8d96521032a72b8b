#!/usr/bin/env bash
# A team's own MariaDB with its binary log on, for observe mode's binlog reader (docs/adopting.md): an instance of
# its own on port 3307 (log_bin, binlog_format = ROW, binlog_row_image = FULL, a server_id, GTIDs as MariaDB keeps
# them), beside the shared one on 3306, which stays as it is (its log off: the polling observer's tests use it).
# Debian's mariadb-server; root with no password on TCP, like the shared one. Idempotent: initialises and starts only
# what is missing. Needs root (CI runs as root).
set -euo pipefail
PORT="${LEGACY_BINLOG_PORT:-3307}"
BASE="${LEGACY_BINLOG_DIR:-/var/lib/claim-control-plane/mariadb-binlog}"
DATA="$BASE/data"
SOCKET="$BASE/mysqld.sock"
if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
  exit 0
fi
if [ ! -x /usr/sbin/mariadbd ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends mariadb-server >/dev/null
fi
mkdir -p "$BASE"
chown -R mysql:mysql "$BASE" 2>/dev/null || true
if [ ! -d "$DATA/mysql" ]; then
  mariadb-install-db --no-defaults --user=mysql --datadir="$DATA" --auth-root-authentication-method=normal \
    --skip-test-db >/dev/null
fi
start-stop-daemon --start --background --oknodo --pidfile "$BASE/mysqld.pid" --exec /usr/sbin/mariadbd -- \
  --no-defaults --user=mysql --datadir="$DATA" --port="$PORT" --bind-address=127.0.0.1 --socket="$SOCKET" \
  --pid-file="$BASE/mysqld.pid" --log-error="$BASE/error.log" \
  --server-id=1 --log-bin="$BASE/binlog" --binlog-format=ROW --binlog-row-image=FULL --binlog-row-metadata=FULL \
  --expire-logs-days=1 --max-connections=300
for _ in $(seq 1 60); do
  (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null && break
  sleep 0.5
done
mariadb --protocol=tcp -h 127.0.0.1 -P "$PORT" -u root -e "SELECT @@log_bin, @@binlog_format" >/dev/null
