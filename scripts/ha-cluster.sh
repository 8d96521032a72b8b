#!/usr/bin/env bash
# The HA PostgreSQL the control plane can run on (docs/deployment.md "High availability"): three PostgreSQL nodes
# under Patroni, one etcd member as Patroni's store, HAProxy sending connections to the leader only (Patroni's
# GET /primary), and PgBouncer in front of HAProxy as in the production profile. Debian's packages, loopback ports,
# everything under $HA_DIR. Needs root the first time (apt-get); PostgreSQL itself runs as the postgres user.
#
#   ha-cluster.sh up            start what is not running (idempotent); last line: DATABASE_URL=… through HAProxy
#   ha-cluster.sh down          stop everything and remove $HA_DIR
#   ha-cluster.sh status        the leader, and each member's role, state, timeline and lag
#   ha-cluster.sh kill-leader   SIGKILL the leader's postmaster (and its processes, as a dying machine); last line:
#                               leader=<new leader> once Patroni has promoted one
#   ha-cluster.sh sync on|off   switch Patroni's synchronous mode (off: asynchronous replication, the default of
#                               most setups — a failover may lose acknowledged commits)
#   ha-cluster.sh pause-replication | resume-replication
#                               cut / heal the leader's replication (a partition), to lose a tail on purpose
#
# Settings (environment): HA_DIR (/tmp/claim-ha), HA_BASE_PORT (5440: HAProxy; nodes +1..+3; PgBouncer +20,
# HAProxy's stats page +21), HA_REST_BASE (8400: Patroni REST 8401..8403), HA_ETCD_PORT (23790; peers +10),
# HA_SYNC (on), HA_DATABASE (controlplane).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TEMPLATES="$HERE/deploy/ha"
DIR="${HA_DIR:-/tmp/claim-ha}"
BASE="${HA_BASE_PORT:-5440}"
HAPROXY_PORT="$BASE"
PGBOUNCER_PORT="$((BASE + 20))"
STATS_PORT="$((BASE + 21))"
ETCD_CLIENT="${HA_ETCD_PORT:-23790}"
ETCD_PEER="$((ETCD_CLIENT + 10))"
DATABASE="${HA_DATABASE:-controlplane}"
NODES=(node1 node2 node3)
VERSION="$(ls /usr/lib/postgresql | sort -n | tail -1)"
BIN_DIR="/usr/lib/postgresql/$VERSION/bin"

pg_port() { echo "$((BASE + ${1#node}))"; }
rest_port() { echo "$((${HA_REST_BASE:-8400} + ${1#node}))"; }
log() { echo "ha-cluster: $*" >&2; }

as_postgres() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

running() {  # running NAME: its pid file names a live process
  local pidfile="$DIR/run/$1.pid"
  [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

spawn() {  # spawn NAME CMD...: in its own session, as postgres, logging to $DIR/run/NAME.log
  local name="$1"; shift
  running "$name" && return 0
  as_postgres setsid "$@" >"$DIR/run/$name.log" 2>&1 < /dev/null &
  echo $! >"$DIR/run/$name.pid"
}

install() {
  local missing=()
  command -v patroni >/dev/null || missing+=(patroni)
  command -v etcd >/dev/null || missing+=(etcd-server)
  command -v etcdctl >/dev/null || missing+=(etcd-client)
  command -v haproxy >/dev/null || missing+=(haproxy)
  command -v pgbouncer >/dev/null || missing+=(pgbouncer)
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    log "needs root to apt-get install ${missing[*]}"; exit 1
  fi
  log "installing ${missing[*]} from Debian"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  for service in etcd patroni haproxy pgbouncer; do  # the packaged services; ours run on their own ports
    (service "$service" stop || true) >/dev/null 2>&1
  done
}

render() {  # render TEMPLATE OUT [KEY=VALUE...]
  local template="$1" out="$2"; shift 2
  local text; text="$(cat "$template")"
  local pair
  for pair in "$@"; do text="${text//@${pair%%=*}@/${pair#*=}}"; done
  printf '%s\n' "$text" >"$out"
}

cluster_json() {  # Patroni's view of the cluster, from the first member that answers
  local node
  for node in "${NODES[@]}"; do
    curl -fsS --max-time 2 "http://127.0.0.1:$(rest_port "$node")/cluster" 2>/dev/null && return 0
  done
  return 1
}

leader() {  # the running leader's name, or nothing
  cluster_json 2>/dev/null | python3 -c '
import json, sys
for m in json.load(sys.stdin).get("members", []):
    if m.get("role") in ("leader", "master", "primary") and m.get("state") == "running":
        print(m["name"])' 2>/dev/null || true
}

has_leader() { [ -n "$(leader)" ]; }

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: poll COMMAND until it succeeds
  local seconds="$1" what="$2"; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then log "timed out after ${seconds}s waiting for $what"; return 1; fi
    sleep 0.5
  done
}

members_streaming() {  # every replica is streaming from the leader
  cluster_json | python3 -c '
import json, sys
members = json.load(sys.stdin).get("members", [])
replicas = [m for m in members if m.get("role") not in ("leader", "master", "primary")]
ok = len(members) == 3 and all(m.get("state") in ("streaming", "running") for m in replicas)
sys.exit(0 if ok else 1)'
}

sync_standby_present() {
  cluster_json | python3 -c '
import json, sys
sys.exit(0 if any(m.get("role") == "sync_standby" for m in json.load(sys.stdin).get("members", [])) else 1)'
}

up() {
  install
  mkdir -p "$DIR/run" "$DIR/etcd" "$DIR/pgbouncer"
  [ "$(id -u)" -eq 0 ] && chown -R postgres:postgres "$DIR"
  chmod 700 "$DIR"
  local sync="${HA_SYNC:-on}" sync_bool=true
  [ "$sync" = off ] && sync_bool=false
  spawn etcd etcd --name ha0 --data-dir "$DIR/etcd/data" \
    --listen-client-urls "http://127.0.0.1:$ETCD_CLIENT" --advertise-client-urls "http://127.0.0.1:$ETCD_CLIENT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
    --initial-cluster "ha0=http://127.0.0.1:$ETCD_PEER" --initial-cluster-state new
  wait_for 30 "etcd" curl -fsS "http://127.0.0.1:$ETCD_CLIENT/health"
  local node servers=""
  for node in "${NODES[@]}"; do
    mkdir -p "$DIR/$node"
    [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$DIR/$node"
    chmod 700 "$DIR/$node"
    render "$TEMPLATES/patroni.yml.in" "$DIR/$node/patroni.yml" NAME="$node" DIR="$DIR" \
      REST_PORT="$(rest_port "$node")" PG_PORT="$(pg_port "$node")" ETCD_HOSTS="127.0.0.1:$ETCD_CLIENT" \
      BIN_DIR="$BIN_DIR" SYNC="$sync_bool" SYNC_STRICT=false MAX_LAG=$((64 * 1024 * 1024))
    servers+="    server $node 127.0.0.1:$(pg_port "$node") maxconn 250 check port $(rest_port "$node")"$'\n'
    [ "$(id -u)" -eq 0 ] && chown postgres:postgres "$DIR/$node/patroni.yml"
    spawn "patroni-$node" patroni "$DIR/$node/patroni.yml"
    if [ "$node" = node1 ]; then wait_for 90 "the first leader" has_leader; fi
  done
  render "$TEMPLATES/haproxy.cfg.in" "$DIR/haproxy.cfg" HAPROXY_PORT="$HAPROXY_PORT" STATS_PORT="$STATS_PORT" \
    SERVERS="${servers%$'\n'}"
  spawn haproxy haproxy -db -f "$DIR/haproxy.cfg"
  render "$TEMPLATES/pgbouncer.ini.in" "$DIR/pgbouncer/pgbouncer.ini" HAPROXY_PORT="$HAPROXY_PORT" \
    PGBOUNCER_PORT="$PGBOUNCER_PORT" DIR="$DIR"
  printf '"postgres" ""\n"root" ""\n' >"$DIR/pgbouncer/userlist.txt"
  [ "$(id -u)" -eq 0 ] && chown -R postgres:postgres "$DIR/pgbouncer" "$DIR/haproxy.cfg"
  spawn pgbouncer pgbouncer "$DIR/pgbouncer/pgbouncer.ini"
  wait_for 120 "every member streaming" members_streaming
  [ "$sync" = on ] && wait_for 60 "a synchronous standby" sync_standby_present
  wait_for 30 "HAProxy to the leader" psql -h 127.0.0.1 -p "$HAPROXY_PORT" -U postgres -d postgres -Atc "select 1"
  if ! psql -h 127.0.0.1 -p "$HAPROXY_PORT" -U postgres -d postgres -Atc \
      "select 1 from pg_database where datname = '$DATABASE'" | grep -q 1; then
    psql -h 127.0.0.1 -p "$HAPROXY_PORT" -U postgres -d postgres -qc "create database \"$DATABASE\""
  fi
  echo "PGBOUNCER_DATABASE_URL=postgres://postgres@127.0.0.1:$PGBOUNCER_PORT/$DATABASE"
  echo "DATABASE_URL=postgres://postgres@127.0.0.1:$HAPROXY_PORT/$DATABASE"
}

down() {
  local name
  for name in pgbouncer haproxy patroni-node1 patroni-node2 patroni-node3 etcd; do
    if running "$name"; then kill -TERM -- "-$(cat "$DIR/run/$name.pid")" 2>/dev/null || true; fi
  done
  sleep 1
  # Patroni stops its PostgreSQL on TERM; whatever is left of a node (a postmaster whose Patroni was killed) goes now.
  pkill -KILL -f "$DIR/" 2>/dev/null || true
  for name in pgbouncer haproxy patroni-node1 patroni-node2 patroni-node3 etcd; do
    if running "$name"; then kill -KILL -- "-$(cat "$DIR/run/$name.pid")" 2>/dev/null || true; fi
  done
  rm -rf "$DIR"
  log "down"
}

status() {
  cluster_json | python3 -c '
import json, sys
members = json.load(sys.stdin).get("members", [])
leaders = [m["name"] for m in members if m.get("role") in ("leader", "master", "primary")]
print("leader=" + (leaders[0] if leaders else "none"))
for m in members:
    fields = (m["name"], m.get("role"), m.get("state"), m.get("timeline", "-"), m.get("lag", 0))
    print("%s role=%s state=%s timeline=%s lag=%s" % fields)'
}

kill_leader() {
  # As a machine that dies: the postmaster and every process it started are SIGKILLed at once (none is left to
  # send one more WAL record); then a partition made by pause-replication heals, and Patroni promotes a replica.
  local old; old="$(leader)"
  [ -n "$old" ] || { log "no running leader"; exit 1; }
  local pid; pid="$(head -1 "$DIR/$old/data/postmaster.pid")"
  log "SIGKILL $old's postmaster (pid $pid) and its processes"
  kill -STOP "$pid" 2>/dev/null || true  # it starts no new child while its children die
  pkill -KILL -P "$pid" 2>/dev/null || true
  kill -KILL "$pid"
  echo "killed_at=$(date +%s.%N)"
  resume_replication
  local deadline=$((SECONDS + 90)) new=""
  while [ "$SECONDS" -lt "$deadline" ]; do
    new="$(leader)"
    if [ -n "$new" ] && [ "$new" != "$old" ]; then echo "leader=$new"; return 0; fi
    sleep 0.2
  done
  log "no new leader within 90 s"; exit 1
}

leader_asynchronous() {  # the leader's commits wait for no standby any more
  [ -z "$(psql -h 127.0.0.1 -p "$(pg_port "$(leader)")" -U postgres -d postgres -Atc "show synchronous_standby_names")" ]
}

set_sync() {
  local value=true
  [ "$1" = off ] && value=false
  local node; node="$(leader)"
  as_postgres patronictl -c "$DIR/$node/patroni.yml" edit-config --force \
    -s "synchronous_mode=$value" >/dev/null
  if [ "$value" = true ]; then
    wait_for 60 "a synchronous standby" sync_standby_present
  else
    wait_for 30 "the leader to stop waiting for a standby" leader_asynchronous
  fi
  log "synchronous_mode=$value"
}


REJECT_LINE="host replication all 127.0.0.1/32 reject # ha-cluster.sh pause-replication"

pause_replication() {
  # A partition between the leader and its replicas: the leader refuses replication connections (pg_hba.conf,
  # reloaded) and its WAL senders are ended, so no replica receives another record. The leader keeps acknowledging
  # commits; in asynchronous mode what it acknowledges now exists nowhere else. (In synchronous mode its commits
  # wait for a standby instead.)
  local node; node="$(leader)"
  [ -n "$node" ] || { log "no running leader"; exit 1; }
  local hba="$DIR/$node/data/pg_hba.conf"
  grep -qF "$REJECT_LINE" "$hba" || sed -i "1i $REJECT_LINE" "$hba"
  psql -h 127.0.0.1 -p "$(pg_port "$node")" -U postgres -d postgres -Atqc "select pg_reload_conf()" >/dev/null
  sleep 0.2
  psql -h 127.0.0.1 -p "$(pg_port "$node")" -U postgres -d postgres -Atqc \
    "select pg_terminate_backend(pid) from pg_stat_replication" >/dev/null
  log "replication paused: $node sends no WAL"
}

resume_replication() {  # the partition heals: every node accepts replication connections again
  local node
  for node in "${NODES[@]}"; do
    local hba="$DIR/$node/data/pg_hba.conf"
    [ -f "$hba" ] && grep -qF "$REJECT_LINE" "$hba" || continue
    sed -i "\|$REJECT_LINE|d" "$hba"
    psql -h 127.0.0.1 -p "$(pg_port "$node")" -U postgres -d postgres -Atqc "select pg_reload_conf()" \
      >/dev/null 2>&1 || true
    log "replication resumed on $node"
  done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  kill-leader) kill_leader ;;
  sync) set_sync "${2:?on or off}" ;;
  pause-replication) pause_replication ;;
  resume-replication) resume_replication ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
