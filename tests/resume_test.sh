#!/usr/bin/env bash
# System test of crash-safe checkpoints and exact resume (learner + actor processes on
# loopback).
#  1. A run with S=2 and two actors; its learner is SIGKILLed four times: at a random step;
#     right after resuming (the newest checkpoint was corrupted before that resume); half-way
#     through writing a checkpoint (fault injection); at a random step again. Each time
#     `echelon learner --resume` continues the run. Checks: every step exactly once and in order, no group
#     consumed twice, staleness <= S on every step, the corrupt and the half-written
#     checkpoints skipped by name, the counts add up, and the same two actor processes served
#     the whole run (they re-registered by themselves).
#  2. S=0, one actor, fixed seed: a run killed and resumed ends with the same weights, bit for
#     bit, as the same run uninterrupted.
# Usage: tests/resume_test.sh path/to/echelon [random-seed]
set -uo pipefail
ECHELON=$(realpath "$1")
CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")
INVARIANTS=$(realpath "$(dirname "$0")/run_invariants.py")
RANDOM=${2:-$$}
source "$(dirname "$0")/lib.sh"
enter_workdir
echo "random seed ${2:-$$} (rerun with: $0 $1 ${2:-$$})"

TINY=(--set warmstart.steps=20 --set task.eval_size=50 --set eval.every=0 --set model.num_hidden_layers=1
      --set rl.groups_per_step=4)
steps_done() { grep -c '^step ' "$1" 2>/dev/null; }
wait_steps() {  # FILE N: waits up to 60 s for N step lines in FILE
  for _ in $(seq 1 600); do [ "$(steps_done "$1")" -ge "$2" ] && return 0; sleep 0.1; done
  return 1
}
start_learner() {  # OUT ARGS...: starts a learner in the background; sets LEARNER
  local out=$1
  shift
  "$ECHELON" learner "$@" --token-file token > "$out" 2> "${out%.out}.err" &
  LEARNER=$!
  PIDS+=("$LEARNER")
}
start_actor() {  # NAME PORT SLOWDOWN; sets LAST
  "$ECHELON" actor --learner "127.0.0.1:$2" --name "$1" --token-file token --slowdown "$3" > "$1.out" 2> "$1.err" &
  LAST=$!
  PIDS+=("$LAST")
}
resumed_version() { sed -n 's/^resuming from .* (version \([0-9]*\)).*/\1/p' "$1"; }
echo "tok-$RANDOM-0123456789abcdef" > token

# --- 1. four crashes ----------------------------------------------------------------
S=2
STEPS=60
# Every learner of the run (config.yaml keeps the setting) holds its first update until both
# actors registered: a resumed learner could otherwise finish the run with the fast actor alone
# while the slowed one waits out its redial backoff, and that actor would never hear the end.
start_learner l1.out "$CONFIG" --listen 127.0.0.1:0 --out run "${TINY[@]}" --set rl.steps=$STEPS \
  --set rl.staleness=$S --set checkpoint.every=3 --set rollout.wait_for_actors=2
port=$(learner_port l1.out)
check "learner listens" test -n "$port"
start_actor a0 "$port" 1.0; A0=$LAST
start_actor a1 "$port" 2.0; A1=$LAST

kill_at=$((5 + RANDOM % 15))
wait_steps l1.out "$kill_at"
kill -9 "$LEARNER"
wait "$LEARNER" 2>/dev/null
echo "crash 1: SIGKILL after step $(steps_done l1.out)"
# Corrupt the newest checkpoint: resume must name it and take the one before.
newest=$(ls -d run/checkpoints/step-* | grep -v tmp | sort -t- -k2 -n | tail -1)
python3 -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[len(b)//2]^=1; open(p,'wb').write(b)" \
  "$newest/model.safetensors"

# Resume 1, killed as soon as it has resumed.
start_learner l2.out --resume run --listen "127.0.0.1:$port" --set checkpoint.every=3
for _ in $(seq 1 300); do [ -n "$(resumed_version l2.out)" ] && break; sleep 0.1; done
v2=$(resumed_version l2.out)
check "resume 1 skipped the corrupt $newest" grep -q "skipping checkpoint $newest: .*model.safetensors.*corrupt" l2.out
check "resume 1 took an earlier checkpoint (v$v2 < ${newest##*-})" test "${v2:-999}" -lt "${newest##*-}"
kill -9 "$LEARNER"
wait "$LEARNER" 2>/dev/null
echo "crash 2: SIGKILL right after resuming at v$v2"
# Resume 2 kills itself half-way through writing a checkpoint a few steps on.
target=$(( (v2 / 3 + 2) * 3 ))
ECHELON_FAULT_KILL_IN_CHECKPOINT="step-$target.tmp" start_learner l3.out --resume run --listen "127.0.0.1:$port"
wait_exit "$LEARNER" 60
rc=$?
echo "crash 3: killed itself writing step-$target (exit $rc)"
check "learner died half-way through writing step-$target" test "$rc" -eq 137
check "the half-written step-$target is on disk" test -n "$(compgen -G "run/checkpoints/step-$target.tmp-*")"
check "step-$target itself was never published" test ! -e "run/checkpoints/step-$target"

# Resume 3, then a SIGKILL at a random later step.
start_learner l4.out --resume run --listen "127.0.0.1:$port"
wait_steps l4.out $((1 + RANDOM % 10))
v4=$(resumed_version l4.out)
check "resume 3 continued from the last whole checkpoint before step-$target" test "$v4" -eq $((target - 3))
kill -9 "$LEARNER"
wait "$LEARNER" 2>/dev/null
echo "crash 4: SIGKILL after resuming at v$v4 and $(steps_done l4.out) steps"

# Resume 4 runs to the end.
start_learner l5.out --resume run --listen "127.0.0.1:$port"
wait_exit "$LEARNER" 120
check "final learner exits 0" test $? -eq 0
for p in "$A0" "$A1"; do
  wait_exit "$p"
  check "actor $p (never restarted) exits 0 when the run ends" test $? -eq 0
done
for a in a0 a1; do
  # A learner that lives only a moment may never hear from a busy actor; the last one must.
  check "$a (the same process) re-registered with the final learner" grep -q "actor $a registered from" l5.err
  check "$a saw a learner restart" grep -q "learner restarted" $a.err
done
check "no half-written checkpoint left" test -z "$(compgen -G 'run/checkpoints/*.tmp-*')"
check "at most checkpoint.keep=3 resumable checkpoints" test "$(ls -d run/checkpoints/step-* | wc -l)" -le 3
/usr/bin/python3 "$INVARIANTS" run/metrics.jsonl --staleness "$S" --steps "$STEPS" --batch 4 --end final \
  --resumes 4 --discarded run/metrics.discarded.jsonl > check1.out 2>&1
check "the history kept has a resume event" grep -q '"event":"resume"' run/metrics.jsonl
check "metrics across the restarts" grep -q '^ok' check1.out
# samples.jsonl was cut back with metrics.jsonl at every resume: each update's samples once, in order.
check "samples once per update across the restarts" /usr/bin/python3 -c "
import json, sys
steps = [json.loads(l)['step'] for l in open('run/samples.jsonl') if l.strip()]
ok = steps == sorted(steps) and all(steps.count(s) <= 4 for s in set(steps)) and set(steps) == set(range(max(steps) + 1))
sys.exit(0 if ok else 1)"
cat check1.out

# --- 2. S=0: killed and resumed == uninterrupted, bit for bit --------------------------
EXACT=(--set rl.staleness=0 --set rl.steps=16 --set checkpoint.every=4 --set seed=7 --set secret=seed)
exact_run() {  # DIR KILL_AT (0: no kill)
  start_learner "$1-a.out" "$CONFIG" --listen 127.0.0.1:0 --out "$1" "${TINY[@]}" "${EXACT[@]}"
  local p
  p=$(learner_port "$1-a.out")
  start_actor "$1-actor" "$p" 1.0
  local actor=$LAST
  if [ "$2" -gt 0 ]; then
    wait_steps "$1-a.out" "$2"
    kill -9 "$LEARNER"
    wait "$LEARNER" 2>/dev/null
    start_learner "$1-b.out" --resume "$1" --listen "127.0.0.1:$p"
  fi
  wait_exit "$LEARNER" 120
  check "$1: learner exits 0" test $? -eq 0
  wait_exit "$actor"
  check "$1: actor exits 0" test $? -eq 0
}
exact_run straight 0
exact_run resumed $((6 + RANDOM % 6))
echo "S=0 run resumed from v$(resumed_version resumed-b.out)"
check "resumed run has a resume event" grep -q '"event":"resume"' resumed/metrics.jsonl
a=$(sha256sum straight/checkpoints/final/model.safetensors | cut -d' ' -f1)
b=$(sha256sum resumed/checkpoints/final/model.safetensors | cut -d' ' -f1)
echo "final weights: uninterrupted $a, killed+resumed $b"
check "S=0 killed+resumed weights equal uninterrupted, bit for bit" test "$a" = "$b"

if [ "$fails" -ne 0 ]; then
  for f in *.out *.err; do echo "== $f"; tail -5 "$f"; done
fi
finish
