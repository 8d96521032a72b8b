#!/usr/bin/env bash
# The MySQL/MariaDB driver the legacy table adapter's tests use against a MariaDB legacy database
# (tests/rollout/test_legacy_table.py): Debian's libmariadb-dev and pkg-config to build mysqlclient, then the
# project's `mysql` extra into the venv. Idempotent: does nothing when the driver imports.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
if "$BIN/python" -c "import MySQLdb, pymysqlreplication" 2>/dev/null; then
  exit 0
fi
if ! pkg-config --exists libmariadb 2>/dev/null && ! pkg-config --exists mysqlclient 2>/dev/null; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "install-mysql-client: needs root to apt-get install libmariadb-dev pkg-config (MariaDB tests skipped)" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends libmariadb-dev pkg-config >/dev/null
fi
"$BIN/pip" install --quiet -e '.[mysql]'
"$BIN/python" -c "import MySQLdb, pymysqlreplication; print('mysqlclient', MySQLdb.version_info[:3])"
