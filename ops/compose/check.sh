#!/usr/bin/env bash
# `make compose-check`: run docker-compose.yml end to end on a machine without Docker Hub and
# without a Docker engine, then tear it down.
#
#   1. tools: podman + runc (Debian packages) behind a Docker-API socket, and the Compose v2 CLI
#      built from the Go module proxy (.tools/bin/docker-compose);
#   2. images: a Debian base from debootstrap (`podman import`), the project's image built from
#      the Dockerfile on it, and stand-ins for the two images the stack pulls (Kafka from the
#      broker jars of ops/kafka/pom.xml, Prometheus from Debian's package: ops/compose/standins/);
#   3. `docker compose up` with two scorer replicas, through ops/compose/standins.yml, which
#      only swaps image names (the services themselves are the ones of docker-compose.yml);
#   4. the loadgen profile against it: its JSON summary must show 0 lost, its HTML report must
#      be served by the `reports` service;
#   5. Prometheus must scrape both replicas, each having consumed records, and load alerts.yml;
#   6. `docker compose down -v`, and no volume of the run may be left.
# Grafana's image cannot be built here: its provisioning and dashboard are checked statically by
# tests/deploy (run first). Runs as root (podman, debootstrap); about 5 minutes once the images
# exist, 10 the first time. Tunables: CHECK_RATE (tx/s, default 1000), CHECK_DURATION (s, 30).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$repo/ops/compose"
state="$repo/.tools/compose-check"
compose_bin="$repo/.tools/bin/docker-compose"
project="fraud-scorer-check"
rate="${CHECK_RATE:-1000}"
duration="${CHECK_DURATION:-30}"
# The scorers' and the worker's history time scale, the one the loadgen keeps to at this rate.
FRAUD_HISTORY_TIME_SCALE="$("$repo/.venv/bin/python" -c "from loadgen.options import DEFAULT_SEED
from loadgen.time_scale import time_scale
print(round(time_scale(DEFAULT_SEED, $rate), 1))")"
export FRAUD_HISTORY_TIME_SCALE
replicas=2
base_image="localhost/debian-base:bookworm"
kafka_image="localhost/standin/apache-kafka:4.1.1"
prometheus_image="localhost/standin/prom-prometheus:debian"
app_image="fraud-scorer:local"
prometheus_url="http://127.0.0.1:9090"
reports_url="http://127.0.0.1:${REPORTS_PORT:-8089}"
export CONTAINERS_CONF="$here/containers.conf"

say() { printf 'compose-check: %s\n' "$*" >&2; }
die() { say "FAILED: $*"; exit 1; }

[[ "$(id -u)" == 0 ]] || die "run as root (rootful podman and debootstrap)"
[[ -x "$compose_bin" ]] || die "$compose_bin missing (make compose-check builds it)"
mkdir -p "$state"

# ── 1. tools ──────────────────────────────────────────────────────────────────────────────────
# dnsname before any network exists: without it containers cannot resolve each other by name.
packages=(podman runc debootstrap golang-github-containernetworking-plugin-dnsname)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  say "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

socket="$state/podman.sock"
podman_pid=""
pump_pid=""
compose() {
  DOCKER_HOST="unix://$socket" DOCKER_BUILDKIT=0 "$compose_bin" -p "$project" \
    -f "$repo/docker-compose.yml" -f "$here/standins.yml" "$@"
}
cleanup() {
  local status=$?
  if [[ -n "$pump_pid" ]]; then kill "$pump_pid" 2>/dev/null || true; fi
  if [[ -n "$podman_pid" ]]; then
    if ((status != 0)); then
      compose logs --no-color --tail 40 >"$state/failure-logs.txt" 2>&1 || true
      say "last logs of every service: $state/failure-logs.txt"
    fi
    compose --profile loadgen down -v --remove-orphans >/dev/null 2>&1 || true
    kill "$podman_pid" 2>/dev/null || true
    wait "$podman_pid" 2>/dev/null || true
  fi
  exit "$status"
}
trap cleanup EXIT
rm -f "$socket"
podman system service --time=0 "unix://$socket" >"$state/podman-service.log" 2>&1 &
podman_pid=$!
for _ in $(seq 50); do [[ -S "$socket" ]] && break; sleep 0.2; done
[[ -S "$socket" ]] || die "podman system service did not open $socket"

# ── 2. images ─────────────────────────────────────────────────────────────────────────────────
if ! podman image exists "$base_image"; then
  mirror="$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)"
  say "debootstrap bookworm from ${mirror:=http://deb.debian.org/debian} (about a minute)"
  rm -rf "$state/rootfs"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$state/rootfs" "$mirror" >"$state/debootstrap.log" 2>&1 \
    || die "debootstrap failed, see $state/debootstrap.log"
  tar -C "$state/rootfs" -c . | podman import - "$base_image" >/dev/null
  rm -rf "$state/rootfs"
fi

build() {  # IMAGE CONTEXT [podman build flags...]
  local image="$1" context="$2"
  shift 2
  say "building $image"
  podman build --format docker --build-arg "BASE_IMAGE=$base_image" -t "$image" "$@" "$context" \
    >"$state/build-$(basename "$context").log" 2>&1 \
    || die "building $image failed, see $state/build-$(basename "$context").log"
}

kafka_context="$state/kafka"
rm -rf "$kafka_context"
cp -R "$here/standins/kafka" "$kafka_context"
cp -R "$("$repo/ops/kafka/kafka.sh" jars)" "$kafka_context/libs"
rm -f "$kafka_context/libs/.complete"
cp "$repo/ops/kafka/log4j2.properties" "$repo/ops/kafka/kafka_ready.py" "$kafka_context/"
build "$kafka_image" "$kafka_context"
build "$prometheus_image" "$here/standins/prometheus"
# The host's CA bundle as the Dockerfile's build secret: pip inside the build trusts what the
# host trusts (a TLS-intercepting proxy here). It never lands in a layer.
build "$app_image" "$repo" --secret "id=ca_bundle,src=/etc/ssl/certs/ca-certificates.crt"

# ── 3. up ─────────────────────────────────────────────────────────────────────────────────────
# podman runs healthchecks from systemd timers; where there is no systemd (containers, CI
# machines), nothing would ever mark a container healthy and `depends_on: service_healthy`
# would wait forever. This loop does what the timers do.
(
  while sleep 5; do
    for name in $(podman ps --filter "label=com.docker.compose.project=$project" --format '{{.Names}}'); do
      podman healthcheck run "$name" >/dev/null 2>&1 || true
    done
  done
) &
pump_pid=$!

say "docker compose up: kafka, topics, $replicas scorer replicas, prometheus, reports"
compose --profile loadgen down -v --remove-orphans >/dev/null 2>&1 || true
podman volume ls -q | sort >"$state/volumes-before.txt"
# Grafana is left out: its image cannot be built here.
compose --profile loadgen up -d --scale "scorer=$replicas" kafka topics scorer prometheus reports \
  >"$state/up.log" 2>&1 || { cat "$state/up.log" >&2; die "docker compose up failed"; }

healthy_scorers() {
  compose ps --format json scorer 2>/dev/null | python3 -c '
import json, sys
text = sys.stdin.read().strip()
rows = json.loads(text) if text.startswith("[") else [json.loads(l) for l in text.splitlines() if l]
print(sum(1 for r in rows if r.get("Health") == "healthy"))'
}
for _ in $(seq 90); do
  [[ "$(healthy_scorers)" == "$replicas" ]] && break
  sleep 2
done
[[ "$(healthy_scorers)" == "$replicas" ]] || die "$replicas healthy scorer replicas expected, got $(healthy_scorers)"
say "$replicas scorer replicas healthy"

# ── 4. load ───────────────────────────────────────────────────────────────────────────────────
say "loadgen: $rate tx/s for $duration s"
# --no-deps: the stack is up; `run` would otherwise re-apply the dependencies at scale 1.
compose --profile loadgen run --rm --no-deps loadgen --rate "$rate" --duration "$duration" \
  --bad-ratio 0.01 --json --quiet >"$state/loadgen.out" 2>"$state/loadgen.err" \
  || { tail -n 30 "$state/loadgen.err" >&2; die "fraud-loadgen failed"; }
tail -n 1 "$state/loadgen.out" >"$state/loadgen-summary.json"
python3 - "$state/loadgen-summary.json" <<'EOF' || die "the load run lost records"
import json, sys
s = json.load(open(sys.argv[1]))
print(
    f"compose-check: loadgen: sent {s['sent']:,}, decided {s['decided']:,}, dead letters "
    f"{s['dead_letters']:,}, lost {s['lost']}, duplicates {s['duplicates']}, "
    f"{s['decided_per_s']:,} decisions/s, p50 {s['p50_ms']:.0f} ms, p99 {s['p99_ms']:.0f} ms",
    file=sys.stderr,
)
sys.exit(0 if s["lost"] == 0 and s["sent"] > 0 else 1)
EOF
curl -fsS -o "$state/report.html" "$reports_url/latest/index.html" \
  || die "the report is not served at $reports_url/latest/index.html"
grep -q "<svg" "$state/report.html" || die "the served report has no charts"
say "report served at $reports_url/latest/index.html"

# ── 5. Prometheus ─────────────────────────────────────────────────────────────────────────────
query() {
  curl -fsS --get "$prometheus_url/api/v1/query" --data-urlencode "query=$1" \
    | python3 -c 'import json, sys; r = json.load(sys.stdin)["data"]["result"]; print(r[0]["value"][1] if r else 0)'
}
sleep 6  # one more scrape after the run
up="$(query 'count(up{job="fraud-scorer"} == 1)')"
busy="$(query 'count(sum by (instance) (fraud_records_consumed_total{job="fraud-scorer"}) > 0)')"
decided="$(query 'sum(fraud_decisions_produced_total{job="fraud-scorer"})')"
rules="$(curl -fsS "$prometheus_url/api/v1/rules" | python3 -c 'import json, sys; print(sum(len(g["rules"]) for g in json.load(sys.stdin)["data"]["groups"]))')"
firing="$(curl -fsS "$prometheus_url/api/v1/alerts" | python3 -c 'import json, sys; print(",".join(a["labels"]["alertname"] for a in json.load(sys.stdin)["data"]["alerts"] if a["state"] == "firing") or "none")')"
say "prometheus: $up replicas up, $busy consumed records, $decided decisions counted, $rules alert rules loaded, firing: $firing"
[[ "$up" == "$replicas" ]] || die "Prometheus scrapes $up scorer replicas, expected $replicas"
[[ "$busy" == "$replicas" ]] || die "$busy of $replicas replicas consumed records"
[[ "$rules" -gt 0 ]] || die "Prometheus loaded no alert rules"

# ── 6. down ───────────────────────────────────────────────────────────────────────────────────
compose --profile loadgen down -v --remove-orphans >"$state/down.log" 2>&1 || die "docker compose down failed"
left="$(podman volume ls -q | sort | comm -13 "$state/volumes-before.txt" - | wc -l)"
[[ "$left" == 0 ]] || die "$left volumes of the run left after down -v"
say "down -v: containers and volumes removed"
say "PASSED"
