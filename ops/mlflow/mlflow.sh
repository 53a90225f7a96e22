#!/usr/bin/env bash
# Start, stop and query a real MLflow tracking server and model registry, for the tests of the
# MLflow model source (FRAUD_MODEL_PATH=models:/<name>@<alias>). The server is MLflow's own,
# installed from PyPI into a virtual environment of its own: the service needs only the client
# (the mlflow extra, mlflow-skinny), and the server's dependencies stay out of the service's.
#
#   ops/mlflow/mlflow.sh up       install the server once, start it, wait until ready
#   ops/mlflow/mlflow.sh down     stop the server this script started (by its pid file)
#   ops/mlflow/mlflow.sh status   say whether it runs
#
# URL: http://127.0.0.1:$MLFLOW_PORT (default 15000), the tracking URI the tests use. State:
# a SQLite store and artifacts under $MLFLOW_STATE_DIR (default .mlflow/), emptied at each start
# (right for tests). Version: $MLFLOW_SERVER_VERSION (default 3.17.2).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../tools/pidfile.sh
source "$repo/ops/tools/pidfile.sh"
state="${MLFLOW_STATE_DIR:-$repo/.mlflow}"
version="${MLFLOW_SERVER_VERSION:-3.17.2}"
port="${MLFLOW_PORT:-15000}"
ready_timeout_s="${MLFLOW_READY_TIMEOUT_S:-120}"
stop_timeout_s=30
venv="$state/venv-$version"
data="$state/data"
logs="$state/logs"
pidfile="$state/mlflow.pid"
url="http://127.0.0.1:$port"

die() { echo "mlflow.sh: $*" >&2; exit 1; }

usage() { echo "usage: $0 up|down|status" >&2; exit 2; }

# Only our server: a process started on our port.
running_pid() { pidfile_running "$pidfile" "mlflow server --host 127.0.0.1 --port $port"; }

is_ready() {
  python3 - "$url/health" <<'EOF'
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=2) as response:
        sys.exit(0 if response.status == 200 else 1)
except Exception:
    sys.exit(1)
EOF
}

install() {
  [[ -x "$venv/bin/python" ]] && return 0
  echo "mlflow.sh: installing mlflow==$version (the server, about 850 MB) into $venv"
  rm -rf "$venv.partial"
  python3 -m venv "$venv.partial" || die "could not make a virtual environment (python3 -m venv)"
  "$venv.partial/bin/pip" install --quiet --disable-pip-version-check "mlflow==$version" \
    || die "could not install mlflow==$version from the package index"
  rm -rf "$venv"
  mv "$venv.partial" "$venv"
}

up() {
  local pid
  if pid="$(running_pid)"; then
    echo "mlflow.sh: already running (pid $pid) at $url"
    return 0
  fi
  install
  rm -rf "$data"
  mkdir -p "$data" "$logs"
  # No job runner: its nine worker processes do nothing the registry needs. `python -m`: the
  # environment was made under another name (see install), so its scripts name the wrong python.
  MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false nohup "$venv/bin/python" -m mlflow server --host 127.0.0.1 \
    --port "$port" --workers 1 --backend-store-uri "sqlite:///$data/mlflow.db" \
    --artifacts-destination "$data/artifacts" </dev/null >"$logs/mlflow.log" 2>&1 &
  echo $! >"$pidfile"
  pidfile_wait_ready "$pidfile" "$ready_timeout_s" "$logs/mlflow.log" "mlflow.sh: the server" \
    is_ready \
    || exit 1
  echo "mlflow.sh: ready at $url (pid $(cat "$pidfile")), logs in $logs"
}

down() {
  local pid
  if ! pid="$(running_pid)"; then
    rm -f "$pidfile"
    echo "mlflow.sh: not running"
    return 0
  fi
  # Its uvicorn worker is a child process: stop the whole group started by nohup.
  pkill -TERM -P "$pid" 2>/dev/null || true
  pidfile_stop "$pidfile" "$pid" "mlflow.sh: the server" "$stop_timeout_s"
  echo "mlflow.sh: stopped (pid $pid)"
}

[[ $# -eq 1 ]] || usage
case "$1" in
  up) up ;;
  down) down ;;
  status)
    if pid="$(running_pid)"; then echo "mlflow.sh: running (pid $pid) at $url"; else echo "mlflow.sh: not running"; exit 3; fi
    ;;
  *) usage ;;
esac
