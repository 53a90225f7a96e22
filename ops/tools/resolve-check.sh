#!/usr/bin/env bash
# `make resolve-check`: does `pip install -e .` resolve on the platforms users install on, and
# with which ONNX Runtime build? Resolves pyproject.toml's runtime dependencies for each target
# with uv (which evaluates the environment markers for the target platform, as pip would on that
# machine), wheels only, and prints the ONNX Runtime line of each resolution.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
uv="${UV:-$repo/.tools/uv/bin/uv}"
[[ -x "$uv" ]] || { echo "resolve-check.sh: uv not found at $uv (make resolve-check installs it)" >&2; exit 1; }
cd "$repo"
status=0
for platform in x86_64-manylinux_2_28 aarch64-manylinux_2_28 aarch64-apple-darwin x86_64-apple-darwin x86_64-pc-windows-msvc; do
  for python in 3.11 3.12 3.13; do
    if out="$("$uv" pip compile --quiet --no-header --no-annotate --only-binary :all: \
      --python-platform "$platform" --python-version "$python" pyproject.toml 2>&1)"; then
      printf '%-24s python %-5s ok   %s\n' "$platform" "$python" "$(grep -E '^onnxruntime' <<<"$out" | tr '\n' ' ')"
    else
      printf '%-24s python %-5s FAIL %s\n' "$platform" "$python" "$(tail -n 3 <<<"$out" | tr '\n' ' ')"
      status=1
    fi
  done
done
exit "$status"
