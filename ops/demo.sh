#!/usr/bin/env bash
# `make demo`: a local Kafka, the topics, one scorer replica, the features worker and a simulated
# load with its labels, then the load generator's summary. Stops what it started. Tunable:
# DEMO_RATE (tx/s), DEMO_DURATION (s), DEMO_METRICS_PORT, DEMO_FEATURES_METRICS_PORT.
#
# Simulated time runs compressed (a day in seconds, FRAUD_HISTORY_TIME_SCALE for both services),
# and terminal risk reads windows that end 7 simulated days back: the labels start to count
# after about 7 days plus their delay. 300 s at 1,000 tx/s is about 31 simulated days, so the
# second half of the run is scored with the risk its labels built, at a rate one shared 2-core
# machine keeps up with (scorer, worker and load generator together).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
py="$repo/.venv/bin/python"
rate="${DEMO_RATE:-1000}"
partitions=3
duration="${DEMO_DURATION:-300}"
port="${DEMO_METRICS_PORT:-9102}"
features_port="${DEMO_FEATURES_METRICS_PORT:-9103}"
out="$repo/.kafka/demo"
mkdir -p "$out"

kafka_started=0
scorer_pid=""
features_pid=""
run_id="$(date +%s)"
# A worker of its own per run, reading from now on: its days are those of this run's time scale.
export FRAUD_FEATURES_APP_ID="fraud-features-demo-$run_id"
export FRAUD_FEATURES_AUTO_OFFSET_RESET=latest
# Card state and terminal risk of this run alone: a risk topic per run, and the demo group's
# card-state changelog deleted at the end (its offsets stay: the next run starts where this one
# stopped). Earlier runs' state would be read back first, for seconds, while the load runs.
export FRAUD_GROUP_ID=fraud-scorer-demo
export FRAUD_TERMINAL_RISK_TOPIC="terminal-risk-demo-$run_id"
cleanup() {
  for pid in "$scorer_pid" "$features_pid"; do
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      wait "$pid" || echo "demo: process $pid exited with status $?" >&2
    fi
  done
  if [[ -n "$features_pid" ]]; then  # the run's own topics
    "$py" -c "import os; from confluent_kafka.admin import AdminClient
from stream.config import ServiceConfig
from terminals.topics import changelog_topic_name, events_topic_name
app = os.environ['FRAUD_FEATURES_APP_ID']
names = [events_topic_name(app), changelog_topic_name(app), os.environ['FRAUD_TERMINAL_RISK_TOPIC']]
names.append(ServiceConfig.from_sources({}, os.environ).changelog_topic)
admin = AdminClient({'bootstrap.servers': '127.0.0.1:9092'})  # held until the futures resolve
existing = admin.list_topics(timeout=30).topics
for future in admin.delete_topics([n for n in names if n in existing], operation_timeout=30).values():
    future.result(timeout=30)" || true
  fi
  if [[ "$kafka_started" == 1 ]]; then ops/kafka/kafka.sh down; fi
}
trap cleanup EXIT

if ! ops/kafka/kafka.sh status >/dev/null 2>&1; then
  ops/kafka/kafka.sh up
  kafka_started=1
fi
"$py" -m stream create-topics --partitions "$partitions"
"$py" -m terminals create-topics --partitions "$partitions"
# Simulated seconds per second at this rate: what the load generator will run at.
FRAUD_HISTORY_TIME_SCALE="$("$py" -c "from simulator.transactions import TransactionSimulator
print(round($rate / TransactionSimulator(7).natural_rate_per_s, 1))")"
export FRAUD_HISTORY_TIME_SCALE

echo "demo: starting fraud-features (log: $out/features.log, metrics: http://127.0.0.1:$features_port/metrics)"
"$py" -m terminals run --table-partitions "$partitions" --metrics-port "$features_port" >"$out/features.log" 2>&1 &
features_pid=$!
for _ in $(seq 120); do
  grep -q "Worker ready" "$out/features.log" && break
  kill -0 "$features_pid" 2>/dev/null || { cat "$out/features.log" >&2; echo "demo: fraud-features died" >&2; exit 1; }
  sleep 0.5
done
grep -q "Worker ready" "$out/features.log" || { echo "demo: fraud-features not ready in 60 s" >&2; exit 1; }

echo "demo: starting the scorer (log: $out/scorer.log, metrics: http://127.0.0.1:$port/metrics)"
"$py" -m stream run --metrics-port "$port" >"$out/scorer.log" 2>&1 &
scorer_pid=$!
# Ready once the card state of its partitions is restored: fraud_state_restore_seconds counts
# one restore per partition (a metric is a contract; a log line is not).
ready() {
  "$py" - "http://127.0.0.1:$port/metrics" "$partitions" 2>/dev/null <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=2).read().decode()
restores = [line for line in text.splitlines() if line.startswith("fraud_state_restore_seconds_count")]
sys.exit(0 if restores and float(restores[0].split()[-1]) >= int(sys.argv[2]) else 1)
PY
}
for _ in $(seq 120); do
  ready && break
  kill -0 "$scorer_pid" 2>/dev/null || { cat "$out/scorer.log" >&2; echo "demo: the scorer died" >&2; exit 1; }
  sleep 0.5
done
ready || { echo "demo: the scorer had not restored its $partitions partitions in 60 s" >&2; exit 1; }

echo "demo: sending ${rate} tx/s for ${duration} s (the handbook's fraud scenarios, 0.5% malformed),"
echo "      simulated time x${FRAUD_HISTORY_TIME_SCALE}, labels as they become known"
"$py" -m loadgen.cli --rate "$rate" --duration "$duration" --bad-ratio 0.005 \
  --metrics-url "http://127.0.0.1:$port/metrics"
