#!/usr/bin/env bash
# `make demo`: a local Kafka, the topics, one scorer replica, the features worker and a simulated
# load with its labels, then the load generator's summary. Stops what it started. Tunable:
# DEMO_RATE (tx/s), DEMO_DURATION (s), DEMO_CARDS (the simulated world's size),
# DEMO_METRICS_PORT, DEMO_FEATURES_METRICS_PORT, DEMO_REVIEW_PORT (the review console's) and
# DEMO_REVIEW_HOLD (seconds the console stays up after the summary, to work the queue; 0).
#
# The review console (fraud-review) runs beside the scorer, on a database of this run alone: its
# URL and a demo user's password, made up at start, are printed before the load begins.
#
# Simulated time runs compressed (a day in seconds, FRAUD_HISTORY_TIME_SCALE for both services,
# which the load generator reads back from the scorer and keeps to), and terminal risk reads
# windows that end 7 simulated days back: the labels start to count after about 7 days plus
# their delay. So the run must last two simulated weeks for its second half to be scored with
# the risk its labels built (the summary's recall halves: compromised terminals are caught
# more in the second). The handbook's world makes about 9,700 transactions a simulated day,
# which the features worker applies at about 650/s on this shared 2-core machine (measured
# under load: at 2,000 tx/s it fell behind, its risk came days late and the second half showed
# nothing). A quarter of that world (1,250 cards, with the handbook's shares of fraud) makes a
# quarter of the transactions per day: 70 s at 500 tx/s is about 14.5 simulated days, and the
# whole demo takes under 2 minutes. `make demo DEMO_DURATION=300` is the five-minute run (about
# 62 simulated days); `make demo DEMO_DURATION=300 DEMO_RATE=1000 DEMO_CARDS=5000` is the run of
# docs/state.md (the handbook's world, about 31 days). A card's first simulated days are
# flagged more (its history is short): the false-positive rate's second half is the one to read.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
py="$repo/.venv/bin/python"
rate="${DEMO_RATE:-500}"
cards="${DEMO_CARDS:-1250}"
partitions=3
duration="${DEMO_DURATION:-70}"
port="${DEMO_METRICS_PORT:-9102}"
features_port="${DEMO_FEATURES_METRICS_PORT:-9103}"
review_port="${DEMO_REVIEW_PORT:-8088}"
review_hold="${DEMO_REVIEW_HOLD:-0}"
out="$repo/.kafka/demo"
mkdir -p "$out"

kafka_started=0
scorer_pid=""
features_pid=""
review_pid=""
run_id="$(date +%s)"
# A worker of its own per run, reading from now on: its days are those of this run's time scale.
export FRAUD_FEATURES_APP_ID="fraud-features-demo-$run_id"
export FRAUD_FEATURES_AUTO_OFFSET_RESET=latest
# Card state, terminal risk and card frauds of this run alone: a risk and a card-frauds topic per
# run, and the demo group's
# card-state changelog deleted at the end (its offsets stay: the next run starts where this one
# stopped). Earlier runs' state would be read back first, for seconds, while the load runs.
export FRAUD_GROUP_ID=fraud-scorer-demo
export FRAUD_TERMINAL_RISK_TOPIC="terminal-risk-demo-$run_id"
export FRAUD_CARD_FRAUDS_TOPIC="card-frauds-demo-$run_id"
cleanup() {
  for pid in "$review_pid" "$scorer_pid" "$features_pid"; do
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      wait "$pid" || echo "demo: process $pid exited with status $?" >&2
    fi
  done
  if [[ -n "$features_pid" ]]; then  # the run's own topics
    "$py" -c "import os; from confluent_kafka.admin import AdminClient
from stream.startup.config import ScorerSettings
from terminals.topics import CARD_TABLE_NAME, changelog_topic_name, events_topic_name
app = os.environ['FRAUD_FEATURES_APP_ID']
names = [events_topic_name(app), changelog_topic_name(app), changelog_topic_name(app, CARD_TABLE_NAME)]
names += [os.environ['FRAUD_TERMINAL_RISK_TOPIC'], os.environ['FRAUD_CARD_FRAUDS_TOPIC']]
names.append(ScorerSettings.from_sources({}, os.environ).changelog_topic)
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
FRAUD_HISTORY_TIME_SCALE="$("$py" -c "from loadgen.options import DEFAULT_SEED
from loadgen.time_scale import time_scale
print(round(time_scale(DEFAULT_SEED, $rate, $cards), 1))")"
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
# one restore per partition, by what it read (a metric is a contract; a log line is not).
ready() {
  "$py" - "http://127.0.0.1:$port/metrics" "$partitions" 2>/dev/null <<'PY'
import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1], timeout=2).read().decode()
restores = [line for line in text.splitlines() if line.startswith("fraud_state_restore_seconds_count")]
sys.exit(0 if sum(float(line.split()[-1]) for line in restores) >= int(sys.argv[2]) else 1)
PY
}
for _ in $(seq 120); do
  ready && break
  kill -0 "$scorer_pid" 2>/dev/null || { cat "$out/scorer.log" >&2; echo "demo: the scorer died" >&2; exit 1; }
  sleep 0.5
done
ready || { echo "demo: the scorer had not restored its $partitions partitions in 60 s" >&2; exit 1; }

review_password="$("$py" -c 'import secrets; print(secrets.token_urlsafe(12))')"
review_db="$out/review-$run_id.db"
echo "$review_password" | "$py" -m review add-user demo --password-stdin --role lead --db "$review_db" >/dev/null
"$py" -m review serve --db "$review_db" --port "$review_port" --group-id "fraud-review-demo-$run_id" \
  --auto-offset-reset latest >"$out/review.log" 2>&1 &
review_pid=$!
for _ in $(seq 60); do
  "$py" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$review_port/readyz', timeout=2)" 2>/dev/null && break
  kill -0 "$review_pid" 2>/dev/null || { cat "$out/review.log" >&2; echo "demo: fraud-review died" >&2; exit 1; }
  sleep 0.5
done
echo "demo: review console on http://127.0.0.1:$review_port (user demo, password $review_password; log: $out/review.log)"

echo "demo: sending ${rate} tx/s for ${duration} s from ${cards} simulated cards (the handbook's fraud scenarios, 0.5% malformed),"
echo "      simulated time x${FRAUD_HISTORY_TIME_SCALE}, labels as they become known"
"$py" -m loadgen.cli --rate "$rate" --cards "$cards" --duration "$duration" --bad-ratio 0.005 \
  --metrics-url "http://127.0.0.1:$port/metrics"
open_cases="$("$py" -c "import urllib.request
text = urllib.request.urlopen('http://127.0.0.1:$review_port/metrics', timeout=5).read().decode()
print(next(int(float(l.split()[-1])) for l in text.splitlines() if l.startswith('fraud_review_open_cases ')))")"
echo "demo: review console: $open_cases open cases on http://127.0.0.1:$review_port (user demo, password $review_password)"
if [[ "$review_hold" -gt 0 ]]; then
  echo "demo: keeping the console up for $review_hold s (DEMO_REVIEW_HOLD); Ctrl-C stops everything"
  sleep "$review_hold"
fi
