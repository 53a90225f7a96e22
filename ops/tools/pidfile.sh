# Shared by the scripts that start a local server in the background and stop it by its pid file
# (ops/kafka/kafka.sh, ops/registry/registry.sh). Source it; it defines functions only.

# pidfile_running PIDFILE MARK: print the pid in PIDFILE and succeed when that process is alive
# and its command line holds MARK (ours, not a pid reused by another process).
pidfile_running() {
  local pidfile="$1" mark="$2" pid
  [[ -f "$pidfile" ]] || return 1
  pid="$(cat "$pidfile")"
  if kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q -- "$mark"; then
    echo "$pid"
    return 0
  fi
  return 1
}

# pidfile_stop PIDFILE PID NAME TIMEOUT_S: SIGTERM, then SIGKILL after TIMEOUT_S; remove PIDFILE.
pidfile_stop() {
  local pidfile="$1" pid="$2" name="$3" timeout_s="$4"
  kill -TERM "$pid"
  for _ in $(seq "$timeout_s"); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 1
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "$name ignored SIGTERM for ${timeout_s}s, killing it" >&2
    kill -KILL "$pid"
  fi
  rm -f "$pidfile"
}

# pidfile_wait_ready PIDFILE TIMEOUT_S LOG NAME CHECK...: run CHECK every 0.5 s until it
# succeeds; fail (return 1, saying why and where to look) when the process in PIDFILE exits or
# TIMEOUT_S pass first.
pidfile_wait_ready() {
  local pidfile="$1" timeout_s="$2" log="$3" name="$4"
  shift 4
  local deadline=$((SECONDS + timeout_s))
  until "$@"; do
    kill -0 "$(cat "$pidfile")" 2>/dev/null || { echo "$name exited while starting; see $log" >&2; return 1; }
    [[ $SECONDS -lt $deadline ]] || { echo "$name was not ready within ${timeout_s}s; see $log" >&2; return 1; }
    sleep 0.5
  done
}
