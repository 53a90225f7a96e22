#!/usr/bin/env bash
# Start, stop and query a single-node Apache Kafka (KRaft) on 127.0.0.1:9092 without Docker.
#
#   ops/kafka/kafka.sh up      resolve the broker jars (Maven), format storage once, start, wait until ready
#   ops/kafka/kafka.sh down    stop the broker this script started (by its pid file)
#   ops/kafka/kafka.sh status  say whether it runs
#
# Jars, data, logs and the pid file live under $KAFKA_STATE_DIR (default: .kafka/ in the repo).
# A second broker beside it (the fault-injection suite's) takes other ports and its own state:
#   KAFKA_PORT=9292 KAFKA_CONTROLLER_PORT=9293 KAFKA_STATE_DIR=.kafka-faults ops/kafka/kafka.sh up
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
state="${KAFKA_STATE_DIR:-$repo/.kafka}"
libs="$state/libs"
data="$state/data"
logs="$state/logs"
pidfile="$state/kafka.pid"
port="${KAFKA_PORT:-9092}"
controller_port="${KAFKA_CONTROLLER_PORT:-9093}"
bootstrap="127.0.0.1:$port"
# A dev/CI broker on a 2-core, 24 GiB machine: 1 GiB heap is ample and leaves room for the tests.
heap="${KAFKA_HEAP_OPTS:--Xms512m -Xmx1g}"
ready_timeout_s="${KAFKA_READY_TIMEOUT_S:-90}"
stop_timeout_s=30

die() { echo "kafka.sh: $*" >&2; exit 1; }

require_tools() {
  command -v java >/dev/null || die "Java 17+ is required (no 'java' on PATH); install a JDK 17 or newer"
  local major
  major="$(java -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ {print $2}')"
  [[ "${major%%.*}" =~ ^[0-9]+$ && "${major%%.*}" -ge 17 ]] || die "Java 17+ is required, found '$major'"
  command -v python3 >/dev/null || die "python3 is required for the readiness check"
}

resolve_jars() {
  if [[ -f "$libs/.complete" && "$libs/.complete" -nt "$here/pom.xml" ]]; then return; fi
  command -v mvn >/dev/null || die "Maven is required to fetch the broker jars (no 'mvn' on PATH)"
  echo "kafka.sh: resolving broker jars from Maven Central into $libs"
  rm -rf "$libs"
  mvn -q -B -f "$here/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$libs" || die "Maven could not resolve ops/kafka/pom.xml"
  touch "$libs/.complete"
}

running_pid() {
  [[ -f "$pidfile" ]] || return 1
  local pid
  pid="$(cat "$pidfile")"
  # Only our broker: the pid must be alive and be a java process started with our config.
  if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$state/server.properties"; then
    echo "$pid"
    return 0
  fi
  return 1
}

java_run() { java -cp "$libs/*" "$@"; }

up() {
  require_tools
  if pid="$(running_pid)"; then
    python3 "$here/kafka_ready.py" --bootstrap "$bootstrap" --timeout "$ready_timeout_s"
    echo "kafka.sh: already running (pid $pid) on $bootstrap"
    return
  fi
  if python3 "$here/kafka_ready.py" --bootstrap "$bootstrap" --timeout 1 2>/dev/null; then
    die "something else already serves Kafka on $bootstrap; stop it first"
  fi
  resolve_jars
  mkdir -p "$data" "$logs"
  # server.properties names the default ports; the copy gets ours.
  { sed -e "s/:9092\b/:$port/g" -e "s/:9093\b/:$controller_port/g" "$here/server.properties"
    echo "log.dirs=$data"; } >"$state/server.properties"
  if [[ ! -f "$data/meta.properties" ]]; then
    local cluster_id
    cluster_id="$(java_run kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)"
    java_run -Dlog4j2.configurationFile="$here/log4j2.properties" -Dkafka.logs.dir="$logs" \
      kafka.tools.StorageTool format --standalone -t "$cluster_id" -c "$state/server.properties" \
      >"$logs/format.out" 2>&1 || { cat "$logs/format.out" >&2; die "storage format failed"; }
  fi
  # shellcheck disable=SC2086  # heap holds several JVM flags
  nohup java $heap -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$here/log4j2.properties" -Dkafka.logs.dir="$logs" \
    -cp "$libs/*" kafka.Kafka "$state/server.properties" >"$logs/kafka.out" 2>&1 &
  echo $! >"$pidfile"
  if ! python3 "$here/kafka_ready.py" --bootstrap "$bootstrap" --timeout "$ready_timeout_s"; then
    tail -n 40 "$logs/kafka.out" >&2 || true
    down
    die "broker did not become ready; logs in $logs"
  fi
  echo "kafka.sh: ready on $bootstrap (pid $(cat "$pidfile")), logs in $logs"
}

down() {
  local pid
  if ! pid="$(running_pid)"; then
    rm -f "$pidfile"
    echo "kafka.sh: not running"
    return
  fi
  kill -TERM "$pid"
  for _ in $(seq "$stop_timeout_s"); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "kafka.sh: broker ignored SIGTERM for ${stop_timeout_s}s, killing it" >&2
    kill -KILL "$pid"
  fi
  rm -f "$pidfile"
  echo "kafka.sh: stopped (pid $pid)"
}

status() {
  if pid="$(running_pid)"; then echo "kafka.sh: running (pid $pid) on $bootstrap"; else echo "kafka.sh: not running"; return 3; fi
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
