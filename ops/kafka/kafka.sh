#!/usr/bin/env bash
# Start, stop and query a single-node Apache Kafka (KRaft) without Docker: the plain development
# broker on 127.0.0.1:9092, or with --secure the secured one on 127.0.0.1:9192. Both can run side
# by side; each has its own ports and state folder.
#
#   ops/kafka/kafka.sh up [--secure]      resolve the broker jars (Maven), format storage once, start, wait until ready
#   ops/kafka/kafka.sh down [--secure]    stop the broker this script started (by its pid file)
#   ops/kafka/kafka.sh status [--secure]  say whether it runs
#   ops/kafka/kafka.sh jars               resolve the broker jars only and print their folder (the
#                                         compose check builds its Kafka image from them)
#
# Plain:  PLAINTEXT on 127.0.0.1:9092, controller on 9093; state in $KAFKA_STATE_DIR (default .kafka/).
# Secure: SASL_SSL (SCRAM-SHA-512 over TLS) on 127.0.0.1:9192, controller on 9193 and inter-broker
#         on 9194 (mutual TLS), StandardAuthorizer with ACLs (ops/kafka/server-secure.properties);
#         state in $KAFKA_SECURE_STATE_DIR (default .kafka-secure/). On first start it generates
#         there a local CA and the broker's certificate (tls/ca.pem is what clients trust), local
#         dev passwords for the users `admin` (super user) and `fraud-scorer`, and one librdkafka
#         properties file per user (clients/<user>.properties). They are dev values, never real
#         secrets; delete the folder to start over. Its readiness check connects as admin with
#         confluent-kafka: it needs the virtualenv (make venv; or KAFKA_READY_PYTHON).
# Both use the broker jars in $KAFKA_STATE_DIR/libs (resolved once).
# A further plain broker beside them (the fault-injection suite's) takes other ports and its own
# state:  KAFKA_PORT=9292 KAFKA_CONTROLLER_PORT=9293 KAFKA_STATE_DIR=.kafka-faults ops/kafka/kafka.sh up
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=../tools/pidfile.sh
source "$repo/ops/tools/pidfile.sh"
plain_state="${KAFKA_STATE_DIR:-$repo/.kafka}"
libs="$plain_state/libs"
# A dev/CI broker on a 2-core, 24 GiB machine: 1 GiB heap is ample and leaves room for the tests.
heap="${KAFKA_HEAP_OPTS:--Xms512m -Xmx1g}"
ready_timeout_s="${KAFKA_READY_TIMEOUT_S:-90}"
stop_timeout_s=30

die() { echo "kafka.sh: $*" >&2; exit 1; }

usage() { echo "usage: $0 up|down|status [--secure] | jars" >&2; exit 2; }

command="${1:-}"
secure=0
case "${2:-}" in
  "") ;;
  --secure) secure=1 ;;
  *) usage ;;
esac
[[ $# -le 2 ]] || usage

if [[ $secure == 1 ]]; then
  state="${KAFKA_SECURE_STATE_DIR:-$repo/.kafka-secure}"
  template="$here/server-secure.properties"
  bootstrap="127.0.0.1:9192"
  ports=(9192 9193 9194)
  name="secured broker"
else
  state="$plain_state"
  template="$here/server.properties"
  port="${KAFKA_PORT:-9092}"
  controller_port="${KAFKA_CONTROLLER_PORT:-9093}"
  bootstrap="127.0.0.1:$port"
  ports=("$port" "$controller_port")
  name="broker"
fi
data="$state/data"
logs="$state/logs"
pidfile="$state/kafka.pid"
tls="$state/tls"
clients="$state/clients"
# The users of the secured broker, created when its storage is formatted. `admin` is its super user.
secure_users=(admin fraud-scorer)

require_tools() {
  command -v java >/dev/null || die "Java 17+ is required (no 'java' on PATH); install a JDK 17 or newer"
  local major
  major="$(java -XshowSettings:properties -version 2>&1 | awk -F'= ' '/java.specification.version/ {print $2}')"
  [[ "${major%%.*}" =~ ^[0-9]+$ && "${major%%.*}" -ge 17 ]] || die "Java 17+ is required, found '$major'"
  command -v python3 >/dev/null || die "python3 is required for the readiness check"
  if [[ $secure == 1 ]]; then
    command -v openssl >/dev/null || die "openssl is required to generate the local CA and certificate (apt-get install openssl)"
  fi
}

resolve_jars() {
  mkdir -p "$plain_state"
  # Both brokers share the jars: the second `up` waits here while the first resolves them.
  exec 9>"$plain_state/libs.lock"
  flock 9 || die "cannot lock $plain_state/libs.lock"
  if [[ -f "$libs/.complete" && "$libs/.complete" -nt "$here/pom.xml" ]]; then exec 9>&-; return; fi
  command -v mvn >/dev/null || die "Maven is required to fetch the broker jars (no 'mvn' on PATH)"
  echo "kafka.sh: resolving broker jars from Maven Central into $libs"
  rm -rf "$libs"
  mvn -q -B -f "$here/pom.xml" dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$libs" || die "Maven could not resolve ops/kafka/pom.xml"
  touch "$libs/.complete"
  exec 9>&-
}

# Only our broker: a java process started with our config.
running_pid() { pidfile_running "$pidfile" "$state/server.properties"; }

java_run() { java -cp "$libs/*" "$@"; }

ready() {
  local timeout_s="$1"
  if [[ $secure == 1 ]]; then
    # Ready means: TLS verifies against our CA, admin authenticates, metadata lists the broker,
    # checked as the service's clients connect (confluent-kafka, from the virtualenv).
    local python="${KAFKA_READY_PYTHON:-$repo/.venv/bin/python}"
    [[ -x $python ]] || die "no virtualenv Python at $python: run \`make venv\` first (the secured broker's readiness check uses confluent-kafka), or set KAFKA_READY_PYTHON"
    (cd "$repo" && "$python" -m ops.kafka.secure_ready --bootstrap "$bootstrap" \
      --timeout "$timeout_s" --config "$clients/admin.properties")
  else
    python3 "$here/kafka_ready.py" --bootstrap "$bootstrap" --timeout "$timeout_s"
  fi
}

# Fails naming the first of our ports that something else listens on.
require_free_ports() {
  local port
  for port in "${ports[@]}"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      die "port $port on 127.0.0.1 is in use by another process (another Kafka?); stop it first"
    fi
  done
}

# A local CA and the broker's certificate (127.0.0.1 and localhost), PEM, made once per state folder.
make_tls() {
  [[ -f "$tls/broker.pem" && -f "$tls/ca.pem" ]] && return
  echo "kafka.sh: generating a local CA and the broker certificate in $tls"
  rm -rf "$tls"
  mkdir -p "$tls"
  local ext="$tls/broker.ext"
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "subjectAltName=IP:127.0.0.1,DNS:localhost" \
    "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth,clientAuth" >"$ext"
  {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
      -subj "/CN=fraud-scorer local dev CA" -keyout "$tls/ca.key" -out "$tls/ca.pem" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" &&
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -subj "/CN=kafka-broker" -keyout "$tls/broker.key" -out "$tls/broker.csr" &&
    openssl x509 -req -in "$tls/broker.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" \
      -CAcreateserial -days 3650 -extfile "$ext" -out "$tls/broker.crt"
  } >"$tls/openssl.out" 2>&1 || { cat "$tls/openssl.out" >&2; die "openssl could not generate the certificates"; }
  # The broker's PEM key store: its private key (PKCS#8, unencrypted) and its certificate chain.
  cat "$tls/broker.key" "$tls/broker.crt" "$tls/ca.pem" >"$tls/broker.pem"
}

# One librdkafka properties file per user: what a client (or FRAUD_KAFKA_CONFIG_FILE) needs.
write_client_properties() {
  local user="$1" password="$2"
  cat >"$clients/$user.properties" <<PROPERTIES
# librdkafka settings of user '$user' on the local secured broker ($bootstrap).
# Generated by ops/kafka/kafka.sh with the storage: a local dev password, not a real secret.
security.protocol=SASL_SSL
sasl.mechanisms=SCRAM-SHA-512
sasl.username=$user
sasl.password=$password
ssl.ca.location=$tls/ca.pem
PROPERTIES
}

format_storage() {
  local cluster_id user password
  local scram=()
  if [[ $secure == 1 ]]; then
    rm -rf "$clients"
    mkdir -p "$clients"
    for user in "${secure_users[@]}"; do
      password="$(openssl rand -hex 16)"
      write_client_properties "$user" "$password"
      scram+=(--add-scram "SCRAM-SHA-512=[name=$user,password=$password]")
    done
  fi
  cluster_id="$(java_run kafka.tools.StorageTool random-uuid 2>/dev/null | tail -n 1)"
  java_run -Dlog4j2.configurationFile="$here/log4j2.properties" -Dkafka.logs.dir="$logs" \
    kafka.tools.StorageTool format --standalone -t "$cluster_id" -c "$state/server.properties" \
    "${scram[@]}" >"$logs/format.out" 2>&1 || { cat "$logs/format.out" >&2; die "storage format failed"; }
}

up() {
  require_tools
  if pid="$(running_pid)"; then
    ready "$ready_timeout_s" || die "the $name (pid $pid) runs but is not ready; logs in $logs"
    echo "kafka.sh: already running (pid $pid) on $bootstrap"
    return
  fi
  require_free_ports
  resolve_jars
  if [[ $secure == 1 ]]; then
    umask 077 # keys and passwords: readable by this user only
    if [[ -f "$data/meta.properties" ]]; then
      for user in "${secure_users[@]}"; do
        [[ -f "$clients/$user.properties" ]] || die "$clients/$user.properties is missing: the users' passwords are lost; remove $state and start again"
      done
    fi
    make_tls
  fi
  mkdir -p "$data" "$logs"
  {
    if [[ $secure == 1 ]]; then
      cat "$template"
    else
      # server.properties names the default ports; the copy gets ours.
      sed -e "s/:9092\b/:$port/g" -e "s/:9093\b/:$controller_port/g" "$template"
    fi
    echo "log.dirs=$data"
    if [[ $secure == 1 ]]; then
      echo "ssl.keystore.location=$tls/broker.pem"
      echo "ssl.truststore.location=$tls/ca.pem"
    fi
  } >"$state/server.properties"
  local formatted=0
  [[ -f "$data/meta.properties" ]] || { format_storage; formatted=1; }
  # shellcheck disable=SC2086  # heap holds several JVM flags
  nohup java $heap -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$here/log4j2.properties" -Dkafka.logs.dir="$logs" \
    -cp "$libs/*" kafka.Kafka "$state/server.properties" >"$logs/kafka.out" 2>&1 &
  echo $! >"$pidfile"
  if ! ready "$ready_timeout_s"; then
    tail -n 40 "$logs/kafka.out" >&2 || true
    down
    if [[ $secure == 1 && $formatted == 0 ]]; then
      # Kafka 4.1.1 replays a SCRAM user deletion wrongly at start-up and can lose every SCRAM
      # user (ScramDelta.apply); the tests therefore never delete users.
      echo "kafka.sh: if the admin's password was refused: a SCRAM user deleted on this broker" \
        "makes Kafka 4.1.1 lose all of them on restart; remove $state and start again" >&2
    fi
    die "the $name did not become ready; logs in $logs"
  fi
  if [[ $secure == 1 ]]; then
    echo "kafka.sh: ready on $bootstrap (SASL_SSL, SCRAM-SHA-512; pid $(cat "$pidfile")), client settings in $clients, logs in $logs"
  else
    echo "kafka.sh: ready on $bootstrap (pid $(cat "$pidfile")), logs in $logs"
  fi
}

down() {
  local pid
  if ! pid="$(running_pid)"; then
    rm -f "$pidfile"
    echo "kafka.sh: $name not running"
    return
  fi
  pidfile_stop "$pidfile" "$pid" "kafka.sh: $name" "$stop_timeout_s"
  echo "kafka.sh: $name stopped (pid $pid)"
}

status() {
  if pid="$(running_pid)"; then echo "kafka.sh: $name running (pid $pid) on $bootstrap"; else echo "kafka.sh: $name not running"; return 3; fi
}

case "$command" in
  up) up ;;
  down) down ;;
  status) status ;;
  jars) resolve_jars >&2; echo "$libs" ;;
  *) usage ;;
esac
