#!/usr/bin/env bash
# `make demo`: a local Kafka, the topics, one scorer replica and a short simulated load, then the
# load generator's summary. Stops what it started. Tunable: DEMO_RATE (tx/s), DEMO_DURATION (s),
# DEMO_METRICS_PORT.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
py="$repo/.venv/bin/python"
rate="${DEMO_RATE:-3000}"
duration="${DEMO_DURATION:-30}"
port="${DEMO_METRICS_PORT:-9102}"
out="$repo/.kafka/demo"
mkdir -p "$out"

kafka_started=0
scorer_pid=""
cleanup() {
  if [[ -n "$scorer_pid" ]] && kill -0 "$scorer_pid" 2>/dev/null; then
    kill -TERM "$scorer_pid"
    wait "$scorer_pid" || echo "demo: scorer exited with status $?" >&2
  fi
  if [[ "$kafka_started" == 1 ]]; then ops/kafka/kafka.sh down; fi
}
trap cleanup EXIT

if ! ops/kafka/kafka.sh status >/dev/null 2>&1; then
  ops/kafka/kafka.sh up
  kafka_started=1
fi
"$py" -m stream create-topics --partitions 3

echo "demo: starting the scorer (log: $out/scorer.log, metrics: http://127.0.0.1:$port/metrics)"
"$py" -m stream run --metrics-port "$port" >"$out/scorer.log" 2>&1 &
scorer_pid=$!
for _ in $(seq 120); do
  grep -q "assigned" "$out/scorer.log" && break
  kill -0 "$scorer_pid" 2>/dev/null || { cat "$out/scorer.log" >&2; echo "demo: the scorer died" >&2; exit 1; }
  sleep 0.5
done
grep -q "assigned" "$out/scorer.log" || { echo "demo: the scorer got no partitions in 60 s" >&2; exit 1; }

echo "demo: sending ${rate} tx/s for ${duration} s (the handbook's fraud scenarios, 0.5% malformed)"
"$py" -m loadgen.cli --rate "$rate" --duration "$duration" --bad-ratio 0.005 \
  --metrics-url "http://127.0.0.1:$port/metrics"
