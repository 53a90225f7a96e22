#!/usr/bin/env bash
# Start, stop and query a real PostgreSQL server for the tests of the review console's shared
# store (FRAUD_REVIEW_DB=postgresql://…): Debian's PostgreSQL (installed with apt when missing),
# a cluster of its own under $POSTGRES_STATE_DIR (default .postgres/), emptied at each start,
# listening on 127.0.0.1:$POSTGRES_PORT (default 15432) with trust authentication: for tests only.
#
#   ops/postgres/postgres.sh up       install once, start, wait until it accepts connections
#   ops/postgres/postgres.sh down     stop the server this script started
#   ops/postgres/postgres.sh status   say whether it runs
#
# The server refuses to run as root: as root it runs as the `postgres` user the package creates.
# URL: postgresql://postgres@127.0.0.1:$POSTGRES_PORT/postgres
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
state="${POSTGRES_STATE_DIR:-$repo/.postgres}"
port="${POSTGRES_PORT:-15432}"
# As root the cluster belongs to `postgres`, which may not reach into the checkout (a clone under
# /root): then the cluster lives under /var/tmp, named after the checkout.
if [[ "$(id -u)" == 0 ]] && ! runuser -u postgres -- test -x "$(dirname "$state")" 2>/dev/null; then
  state="/var/tmp/fraud-scorer-postgres-$(printf '%s' "$repo" | cksum | cut -d' ' -f1)"
fi
data="$state/data"

bin_dir() {
  local found
  found="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)"
  [[ -n "$found" ]] && echo "$found"
}

install() {
  bin_dir >/dev/null && return 0
  command -v apt-get >/dev/null || {
    echo "postgres.sh: no PostgreSQL server and no apt-get; install PostgreSQL 13+" >&2
    exit 1
  }
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -qq postgresql >/dev/null 2>&1; then
    apt-get update -qq
    apt-get install -y -qq postgresql >/dev/null
  fi
}

as_owner() {  # run a server program as the cluster's owner
  if [[ "$(id -u)" == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi
}

running() {
  local bin
  bin="$(bin_dir)" || return 1
  [[ -f "$data/postmaster.pid" ]] && as_owner "$bin/pg_ctl" -D "$data" status >/dev/null 2>&1
}

case "${1:-}" in
  up)
    if running; then echo "postgres.sh: already running on 127.0.0.1:$port"; exit 0; fi
    install
    bin="$(bin_dir)"
    rm -rf "$state"
    mkdir -p "$state"
    if [[ "$(id -u)" == 0 ]]; then chown postgres: "$state"; fi
    as_owner "$bin/initdb" -D "$data" -U postgres --auth=trust --encoding=UTF8 >"$state/initdb.log" 2>&1 \
      || { cat "$state/initdb.log" >&2; exit 1; }
    as_owner "$bin/pg_ctl" -D "$data" -l "$state/server.log" -w -t 60 \
      -o "-p $port -c listen_addresses=127.0.0.1 -k $state -c fsync=off" start >/dev/null \
      || { cat "$state/server.log" >&2; exit 1; }
    echo "postgres.sh: ready on 127.0.0.1:$port, logs in $state/server.log"
    ;;
  down)
    if running; then as_owner "$(bin_dir)/pg_ctl" -D "$data" -m fast -w stop >/dev/null; fi
    echo "postgres.sh: stopped"
    ;;
  status)
    if running; then echo "postgres.sh: running on 127.0.0.1:$port"; else echo "postgres.sh: not running"; exit 1; fi
    ;;
  *)
    echo "usage: $0 up|down|status" >&2
    exit 2
    ;;
esac
