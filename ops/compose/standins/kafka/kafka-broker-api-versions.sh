#!/usr/bin/env bash
# The stand-in's health probe, under the path the compose healthcheck calls: exit 0 once the
# broker at --bootstrap-server answers a Metadata request (ops/kafka/kafka_ready.py; the
# kafka-tools jar that the real script runs is not among the broker jars).
set -euo pipefail
bootstrap=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bootstrap-server) bootstrap="$2"; shift 2 ;;
    *) shift ;;
  esac
done
exec python3 /opt/kafka/config/kafka_ready.py --bootstrap "${bootstrap:?--bootstrap-server is required}" --timeout 5
