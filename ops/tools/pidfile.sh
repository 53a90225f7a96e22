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
