#!/usr/bin/env bash
# Build kube-apiserver and etcd from the Go module proxy into .tools/bin, for `make helm-check`'s
# server-side dry run. About 10 minutes on 2 cores the first time (the Go build cache keeps the
# next builds short); needs Go at least the version k8s.io/kubernetes' go.mod asks for (or
# GOTOOLCHAIN=auto to fetch it from the proxy).
#
# k8s.io/kubernetes replaces its k8s.io/* staging modules with folders that its module zip does
# not contain, so it is built from a small wrapper module that points each of them at the
# published module of the same release (k8s.io/api v0.X.Y for kubernetes v1.X.Y).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
kubernetes_version="${KUBERNETES_VERSION:-v1.36.3}"
bin="$repo/.tools/bin"
work="$repo/.tools/kube-build"
mkdir -p "$bin" "$work"

if [[ ! -x "$bin/kube-apiserver" ]]; then
  dir="$(go mod download -json "k8s.io/kubernetes@$kubernetes_version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  staging="v0.${kubernetes_version#v1.}"
  {
    echo "module fraud-scorer.local/kube-build"
    echo
    sed -n 's/^go \(.*\)/go \1/p' "$dir/go.mod"
    echo
    echo "require k8s.io/kubernetes $kubernetes_version"
    echo
    echo "replace ("
    sed -n 's#^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/src/.*#\t\1 => \1 '"$staging"'#p' "$dir/go.mod"
    echo ")"
  } >"$work/go.mod"
  echo "build-apiserver.sh: building kube-apiserver $kubernetes_version"
  (cd "$work" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
    -o "$bin/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver)
fi

if [[ ! -x "$bin/etcd" ]]; then
  # The etcd release that this Kubernetes release is tested with (its go.mod). Its server module
  # replaces its sibling modules with folders too: the same wrapper trick, with the published
  # modules of that release.
  dir="$(go mod download -json "k8s.io/kubernetes@$kubernetes_version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  etcd_version="$(sed -n 's#^[[:space:]]*go.etcd.io/etcd/server/v3 \(v[^ ]*\).*#\1#p' "$dir/go.mod" | head -n 1)"
  etcd_work="$repo/.tools/etcd-build"
  mkdir -p "$etcd_work"
  etcd_dir="$(go mod download -json "go.etcd.io/etcd/server/v3@$etcd_version" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  {
    echo "module fraud-scorer.local/etcd-build"
    echo
    sed -n 's/^go \(.*\)/go \1/p' "$etcd_dir/go.mod"
    echo
    echo "require go.etcd.io/etcd/server/v3 $etcd_version"
    echo
    echo "replace ("
    sed -n 's#^[[:space:]]*\(go.etcd.io/etcd/[^ ]*\) => \.\./.*#\t\1 => \1 '"$etcd_version"'#p' "$etcd_dir/go.mod"
    echo ")"
  } >"$etcd_work/go.mod"
  echo "build-apiserver.sh: building etcd $etcd_version"
  (cd "$etcd_work" && GOFLAGS=-mod=mod CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" \
    -o "$bin/etcd" go.etcd.io/etcd/server/v3)
fi
