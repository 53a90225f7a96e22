#!/usr/bin/env bash
# `make helm-check`: validate deploy/helm/fraud-scorer for real.
#
#   1. helm lint --strict, with the default values and with the GPU profile and options on;
#   2. helm template for the combinations users run (default; GPU; Kafka secret +
#      ServiceMonitor; existing secret + PodMonitor + fixed replicas + required anti-affinity;
#      exactly-once as a StatefulSet), into .tools/helm-check/;
#   3. the rendered contracts (ops/k8s/check_rendered.py): env read and accepted by the service,
#      KEDA on the replicas' group/topic, grace longer than the drain, max replicas <= partitions;
#   4. a server-side dry run with strict field validation (ops/k8s/dry_run.py) against a real
#      kube-apiserver and etcd built from the Go module proxy (ops/k8s/build-apiserver.sh), with
#      KEDA's CRDs from github.com/kedacore/keda/v2 and Prometheus Operator's from
#      github.com/prometheus-operator/prometheus-operator, both fetched with `go mod download`.
# Needs Go and openssl; the first run builds kube-apiserver and etcd (about 10 minutes on 2
# cores), later runs take about a minute.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
chart="$repo/deploy/helm/fraud-scorer"
out="$repo/.tools/helm-check"
helm="$repo/.tools/bin/helm"
py="$repo/.venv/bin/python"
kube_version="${KUBERNETES_VERSION:-v1.36.3}"
keda_version="${KEDA_VERSION:-v2.21.0}"
prometheus_operator_version="${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}"
etcd_port=23790
apiserver_port=36443

say() { printf 'helm-check: %s\n' "$*" >&2; }
die() { say "FAILED: $*"; exit 1; }
[[ -x "$helm" ]] || die "$helm missing (make helm-check builds it)"
rm -rf "$out"
mkdir -p "$out"

# ── 1. lint ───────────────────────────────────────────────────────────────────────────────────
say "helm lint"
"$helm" lint --strict "$chart" >"$out/lint.log" 2>&1 || { cat "$out/lint.log" >&2; die "helm lint"; }
"$helm" lint --strict "$chart" -f "$chart/values-gpu.yaml" \
  --set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true \
  --set-string 'kafka.config.properties.security\.protocol=SASL_SSL' \
  >>"$out/lint.log" 2>&1 || { cat "$out/lint.log" >&2; die "helm lint (gpu, options)"; }

# ── 2. render ─────────────────────────────────────────────────────────────────────────────────
render() {  # NAME [helm template flags...]
  local name="$1"
  shift
  "$helm" template fraud "$chart" --kube-version "${kube_version#v}" --namespace fraud-scorer-check "$@" \
    >"$out/$name.yaml" || die "helm template ($name)"
}
render default
render gpu -f "$chart/values-gpu.yaml"
render secret-servicemonitor --set metrics.serviceMonitor.enabled=true \
  --set-string 'kafka.config.properties.security\.protocol=SASL_SSL' \
  --set-string 'kafka.config.properties.sasl\.mechanism=SCRAM-SHA-512' \
  --set-string 'kafka.config.properties.sasl\.username=fraud-scorer' \
  --set-string 'kafka.config.properties.sasl\.password=not-a-secret' \
  --set autoscaling.authenticationRef=kafka-credentials
render existing-secret-podmonitor --set metrics.podMonitor.enabled=true \
  --set kafka.config.existingSecret=kafka-client --set autoscaling.enabled=false \
  --set replicaCount=3 --set antiAffinity=required --set topics.create=false
render statefulset-exactly-once --set workload=StatefulSet \
  --set-string env.FRAUD_PROCESSING_GUARANTEE=exactly-once
say "rendered $(ls "$out"/*.yaml | wc -l) value sets into $out"

# ── 3. contracts ──────────────────────────────────────────────────────────────────────────────
say "rendered contracts"
(cd "$repo" && "$py" ops/k8s/check_rendered.py "$out"/*.yaml) || die "rendered contracts"

# ── 4. server-side dry run ────────────────────────────────────────────────────────────────────
"$repo/ops/k8s/build-apiserver.sh"
mod_dir() { go mod download -json "$1" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p'; }
keda="$(mod_dir "github.com/kedacore/keda/v2@$keda_version")"
prometheus_operator="$(mod_dir "github.com/prometheus-operator/prometheus-operator@$prometheus_operator_version")"
crds=(
  "$keda/config/crd/bases/keda.sh_scaledobjects.yaml"
  "$keda/config/crd/bases/keda.sh_triggerauthentications.yaml"
  "$prometheus_operator/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"
  "$prometheus_operator/example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml"
)

cluster="$out/cluster"
mkdir -p "$cluster/etcd" "$cluster/certs"
pids=()
stop() {  # PID: SIGTERM, then SIGKILL after 10 s (kube-apiserver may linger without etcd)
  kill "$1" 2>/dev/null || return 0
  for _ in $(seq 20); do
    kill -0 "$1" 2>/dev/null || return 0
    sleep 0.5
  done
  kill -KILL "$1" 2>/dev/null || true
}
cleanup() {
  local status=$?
  # kube-apiserver first, then etcd.
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do stop "${pids[i]}"; done
  exit "$status"
}
trap cleanup EXIT
openssl genrsa -out "$cluster/sa.key" 2048 2>/dev/null
openssl rsa -in "$cluster/sa.key" -pubout -out "$cluster/sa.pub" 2>/dev/null
token="$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
echo "$token,helm-check,helm-check,system:masters" >"$cluster/tokens.csv"

"$repo/.tools/bin/etcd" --data-dir "$cluster/etcd" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls http://127.0.0.1:23800 --initial-advertise-peer-urls http://127.0.0.1:23800 \
  --initial-cluster default=http://127.0.0.1:23800 >"$cluster/etcd.log" 2>&1 &
pids+=($!)
"$repo/.tools/bin/kube-apiserver" --etcd-servers "http://127.0.0.1:$etcd_port" \
  --bind-address 127.0.0.1 --secure-port "$apiserver_port" --cert-dir "$cluster/certs" \
  --token-auth-file "$cluster/tokens.csv" --authorization-mode AlwaysAllow \
  --service-account-issuer https://kubernetes.default.svc \
  --service-account-key-file "$cluster/sa.pub" --service-account-signing-key-file "$cluster/sa.key" \
  --service-cluster-ip-range 10.96.0.0/24 --enable-priority-and-fairness=false \
  >"$cluster/kube-apiserver.log" 2>&1 &
pids+=($!)
say "waiting for kube-apiserver $kube_version on 127.0.0.1:$apiserver_port"
ready() {
  curl -ksf --max-time 5 -H "Authorization: Bearer $token" \
    "https://127.0.0.1:$apiserver_port/readyz" >/dev/null 2>&1
}
for _ in $(seq 120); do
  ready && break
  for pid in "${pids[@]}"; do
    kill -0 "$pid" 2>/dev/null || die "etcd or kube-apiserver exited, logs in $cluster"
  done
  sleep 1
done
ready || { tail -n 20 "$cluster/kube-apiserver.log" >&2; die "kube-apiserver did not become ready"; }

say "server-side dry run (fieldValidation=Strict), CRDs: KEDA $keda_version, Prometheus Operator $prometheus_operator_version"
crd_args=()
for crd in "${crds[@]}"; do crd_args+=(--crd "$crd"); done
"$py" "$repo/ops/k8s/dry_run.py" --server "https://127.0.0.1:$apiserver_port" --token "$token" \
  "${crd_args[@]}" "$out"/*.yaml || die "the API server rejected objects"
say "negative controls: objects the dry run must reject (ops/k8s/must-reject.yaml)"
"$py" "$repo/ops/k8s/dry_run.py" --server "https://127.0.0.1:$apiserver_port" --token "$token" \
  --must-reject "$repo/ops/k8s/must-reject.yaml" || die "the dry run accepted a broken object"
say "PASSED"
