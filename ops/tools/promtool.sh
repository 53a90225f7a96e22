#!/usr/bin/env bash
# Put Debian's promtool (from the `prometheus` package) under DIR without installing the package:
# installing it would also start a Prometheus server on :9090 on hosts with systemd.
#
#   ops/tools/promtool.sh DIR      # then DIR/usr/bin/promtool
#
# Needs apt (Debian/Ubuntu; CI runs as root). Elsewhere install Prometheus' own release, e.g.
# `brew install prometheus`, and `make alerts-check` uses the promtool on PATH.
set -euo pipefail
[[ $# -eq 1 ]] || { echo "usage: $0 DIR" >&2; exit 2; }
mkdir -p "$1"
dir="$(cd "$1" && pwd)"
command -v apt-get >/dev/null || { echo "promtool.sh: no apt-get here; put promtool on PATH" >&2; exit 1; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$work"
if ! apt-get download prometheus >/dev/null 2>&1; then
  apt-get update -qq
  apt-get download prometheus
fi
dpkg-deb -x prometheus_*.deb "$dir"
"$dir/usr/bin/promtool" --version | head -n 1
