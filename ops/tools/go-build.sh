#!/usr/bin/env bash
# Build a Go command from a module on the Go module proxy into a folder of ours.
#
#   ops/tools/go-build.sh MODULE VERSION PACKAGE OUTPUT
#   e.g. ops/tools/go-build.sh helm.sh/helm/v3 v3.22.0 ./cmd/helm .tools/bin/helm
#
# The module is downloaded with `go mod download` (checksums checked against the module's go.sum
# and the checksum database), copied out of the read-only module cache, and built there with the
# module's own go.mod and go.sum. Needs Go 1.21+ on PATH; a newer toolchain that the module asks
# for comes from the module proxy too (GOTOOLCHAIN=auto). Nothing is installed system-wide.
set -euo pipefail

[[ $# -eq 4 ]] || { echo "usage: $0 MODULE VERSION PACKAGE OUTPUT" >&2; exit 2; }
module="$1" version="$2" package="$3" output="$4"
command -v go >/dev/null || { echo "go-build.sh: Go 1.21+ is required (no 'go' on PATH)" >&2; exit 1; }

dir="$(go mod download -json "$module@$version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
[[ -n "$dir" && -d "$dir" ]] || { echo "go-build.sh: could not download $module@$version" >&2; exit 1; }
work="$(mktemp -d)"
trap 'chmod -R u+w "$work"; rm -rf "$work"' EXIT
cp -R "$dir/." "$work/"
chmod -R u+w "$work"
mkdir -p "$(dirname "$output")"
output="$(cd "$(dirname "$output")" && pwd)/$(basename "$output")"
echo "go-build.sh: building $module@$version $package -> $output"
(cd "$work" && GOTOOLCHAIN="${GOTOOLCHAIN:-auto}" GOFLAGS=-mod=mod CGO_ENABLED=0 \
  go build -trimpath -ldflags "-s -w" -o "$output" "$package")
