# Shared helpers of the system tests (sourced, not run).
#   check NAME COMMAND...   counts a pass when COMMAND succeeds, else prints FAIL: NAME
#   finish                  prints "N passed, M failed" and returns non-zero on any failure
#   learner_port FILE       waits up to 60 s for "learner serving actors on port P" in FILE; prints P
#   serve_port FILE         waits up to 60 s for "serving NAME on http://HOST:PORT" in FILE; prints PORT
#   wait_exit PID [SECONDS] waits up to SECONDS (default 20) for PID to exit (then kills it);
#                           returns its status
#   start_server CMD...     starts CMD in the background (stdout to server.port, whose first line
#                           is the port it listens on; stderr to server.err), adds it to PIDS,
#                           waits up to 10 s for the port; sets SERVER (the pid) and PORT
#   TINY_MODEL_YAML         the `model:` line of a config for a model that trains in seconds
#   enter_workdir           makes a temporary WORK dir and cd's into it; on exit every pid in
#                           PIDS is killed and WORK removed (after `extra_cleanup`, if defined)
#   need_jq                 installs jq when it is missing (scripts/install-deps.sh installs it)
fails=0
pass=0
TINY_MODEL_YAML='model: {hidden_size: 32, num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1, head_dim: 16, intermediate_size: 64}'
check() {
  local name=$1
  shift
  if "$@"; then pass=$((pass + 1)); else echo "FAIL: $name"; fails=$((fails + 1)); fi
}
need_jq() {
  command -v jq >/dev/null || { apt-get update -qq && apt-get install -y -qq jq >/dev/null; }
}
finish() {
  echo "$pass passed, $fails failed"
  [ "$fails" -eq 0 ]
}
# _wait_for FILE SED_SCRIPT [SECONDS]: up to SECONDS (60) for the script to print something from
# FILE; prints it.
_wait_for() {
  local found=""
  for _ in $(seq 1 $((${3:-60} * 10))); do
    found=$(sed -n "$2" "$1" 2>/dev/null)
    [ -n "$found" ] && break
    sleep 0.1
  done
  echo "$found"
}
# A learner warm-starts before it serves: on a loaded 2-core machine that took over a minute.
learner_port() { _wait_for "$1" 's/^learner serving actors on port \([0-9]*\)$/\1/p' 180; }
serve_port() { _wait_for "$1" 's|^serving .* on http://[^:]*:\([0-9]*\)$|\1|p'; }
wait_exit() {
  for _ in $(seq 1 $((${2:-20} * 10))); do
    kill -0 "$1" 2>/dev/null || { wait "$1"; return $?; }
    sleep 0.1
  done
  kill -9 "$1"
  wait "$1"
  return 124
}
start_server() {
  "$@" > server.port 2> server.err &
  SERVER=$!
  PIDS+=("$SERVER")
  for _ in $(seq 1 100); do [ -s server.port ] && break; sleep 0.1; done
  PORT=$(head -n1 server.port)
}
enter_workdir() {
  WORK=$(mktemp -d)
  PIDS=()
  trap _cleanup EXIT
  cd "$WORK" || exit 1
}
_cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
  if declare -F extra_cleanup >/dev/null; then extra_cleanup; fi
  rm -rf "$WORK"
}
