#!/usr/bin/env bash
# Start, stop and query a real Schema Registry without Docker: Apicurio Registry, whose
# Confluent-compatible API (/apis/ccompat/v7) the Confluent clients speak to as to Confluent's own
# registry. Maven Central serves the complete, prebuilt application; it needs Java 21+.
#
#   ops/registry/registry.sh up       fetch the application once (Maven), start it, wait until ready
#   ops/registry/registry.sh down     stop the registry this script started (by its pid file)
#   ops/registry/registry.sh status   say whether it runs
#
# URL: http://127.0.0.1:$REGISTRY_PORT/apis/ccompat/v7 (default port 18081), management (health) on
# $REGISTRY_MANAGEMENT_PORT (18091). State: in memory (every start is empty, right for tests);
# the application and the logs under $REGISTRY_STATE_DIR (default .registry/).
# Java: $REGISTRY_JAVA_HOME, else the newest JDK 21+ under /usr/lib/jvm, else `java` if it is 21+.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../tools/pidfile.sh
source "$repo/ops/tools/pidfile.sh"
state="${REGISTRY_STATE_DIR:-$repo/.registry}"
version="${REGISTRY_VERSION:-3.3.3}"
port="${REGISTRY_PORT:-18081}"
management_port="${REGISTRY_MANAGEMENT_PORT:-18091}"
ready_timeout_s="${REGISTRY_READY_TIMEOUT_S:-120}"
stop_timeout_s=30
dist="$state/dist-$version"
logs="$state/logs"
pidfile="$state/registry.pid"
url="http://127.0.0.1:$port/apis/ccompat/v7"
ready_url="http://127.0.0.1:$management_port/health/ready"

die() { echo "registry.sh: $*" >&2; exit 1; }

usage() { echo "usage: $0 up|down|status" >&2; exit 2; }

java_major() { # the major version of the java at $1, or 0
  "$1" -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ {print $2}' | cut -d. -f1 | grep -E '^[0-9]+$' || echo 0
}

find_java() {
  if [[ -n "${REGISTRY_JAVA_HOME:-}" ]]; then
    [[ "$(java_major "$REGISTRY_JAVA_HOME/bin/java")" -ge 21 ]] \
      || die "REGISTRY_JAVA_HOME=$REGISTRY_JAVA_HOME is not a Java 21+ JDK"
    echo "$REGISTRY_JAVA_HOME/bin/java"
    return
  fi
  local best="" best_major=0 candidate major
  for candidate in /usr/lib/jvm/*/bin/java $(command -v java || true); do
    [[ -x "$candidate" ]] || continue
    major="$(java_major "$candidate")"
    if [[ "$major" -gt "$best_major" ]]; then best="$candidate" best_major="$major"; fi
  done
  [[ "$best_major" -ge 21 ]] || die "Apicurio Registry needs Java 21 or newer; found none (newest: ${best_major}). Install a JDK 21+ or set REGISTRY_JAVA_HOME"
  echo "$best"
}

# Only our registry: a process started on our port.
running_pid() { pidfile_running "$pidfile" "quarkus.http.port=$port"; }

is_ready() {
  python3 - "$ready_url" "$url/subjects" <<'EOF'
import sys, urllib.request
try:
    for address in sys.argv[1:]:
        with urllib.request.urlopen(address, timeout=2) as response:
            if response.status != 200:
                sys.exit(1)
except Exception:
    sys.exit(1)
EOF
}

fetch() {
  [[ -f "$dist/quarkus-run.jar" ]] && return 0
  command -v mvn >/dev/null || die "Maven is required to fetch the registry (no 'mvn' on PATH)"
  mkdir -p "$dist"
  echo "registry.sh: fetching io.apicurio:apicurio-registry-app:$version (about 150 MB) from Maven Central"
  mvn -B -q dependency:copy \
    -Dartifact="io.apicurio:apicurio-registry-app:$version:tar.gz:all" -DoutputDirectory="$dist" \
    || die "could not fetch the registry from Maven Central"
  tar xzf "$dist/apicurio-registry-app-$version-all.tar.gz" -C "$dist"
  rm -f "$dist/apicurio-registry-app-$version-all.tar.gz"
  [[ -f "$dist/quarkus-run.jar" ]] || die "the registry archive holds no quarkus-run.jar"
}

up() {
  local pid java
  if pid="$(running_pid)"; then
    echo "registry.sh: already running (pid $pid) at $url"
    return 0
  fi
  java="$(find_java)"
  fetch
  mkdir -p "$logs"
  # A small heap and a quick JIT: a test registry holds a few schemas.
  cd "$dist"  # quarkus-run.jar finds its lib/ beside it
  nohup "$java" -Xms64m -Xmx384m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$port" \
    -Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port="$management_port" \
    -Dquarkus.http.access-log.enabled=false \
    -jar quarkus-run.jar </dev/null >"$logs/registry.log" 2>&1 &
  echo $! >"$pidfile"
  pidfile_wait_ready "$pidfile" "$ready_timeout_s" "$logs/registry.log" "registry.sh: the registry" \
    is_ready || exit 1
  echo "registry.sh: ready at $url (pid $(cat "$pidfile")), logs in $logs"
}

down() {
  local pid
  if ! pid="$(running_pid)"; then
    rm -f "$pidfile"
    echo "registry.sh: not running"
    return 0
  fi
  pidfile_stop "$pidfile" "$pid" "registry.sh: the registry" "$stop_timeout_s"
  echo "registry.sh: stopped (pid $pid)"
}

[[ $# -eq 1 ]] || usage
case "$1" in
  up) up ;;
  down) down ;;
  status)
    if pid="$(running_pid)"; then echo "registry.sh: running (pid $pid) at $url"; else echo "registry.sh: not running"; exit 3; fi
    ;;
  *) usage ;;
esac
