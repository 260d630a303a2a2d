#!/usr/bin/env bash
# System test of the echelon binary: a short real run, evaluation of its checkpoints, and the
# one-line errors a user gets for bad configs, files and checkpoints.
# Usage: tests/cli_test.sh path/to/echelon
set -uo pipefail
source "$(dirname "$0")/lib.sh"
ECHELON=$(realpath "$1")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
contains() { grep -q -- "$2" "$1"; }

TINY=(--set model.hidden_size=32 --set model.num_hidden_layers=1 --set model.num_attention_heads=2
      --set model.num_key_value_heads=1 --set model.head_dim=16 --set model.intermediate_size=64
      --set warmstart.steps=5 --set rl.steps=4 --set rl.groups_per_step=4 --set task.eval_size=30 --set eval.every=2)
CONFIG=$(dirname "$ECHELON")/../configs/math-tiny.yaml
[ -f "$CONFIG" ] || CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")

# A short real run leaves a complete run directory.
timeout 300 "$ECHELON" train "$CONFIG" --out run "${TINY[@]}" > train.out 2> train.err
check "train exits 0" test $? -eq 0
for f in config.yaml metrics.jsonl heldout.jsonl checkpoints/warmstart/model.safetensors \
         checkpoints/warmstart/config.json checkpoints/warmstart/tokenizer.json checkpoints/final/model.safetensors; do
  check "run has $f" test -s "run/$f"
done
check "progress line per step" test "$(grep -c '^step ' train.out)" -eq 4
for key in step version wall_s reward_mean staleness_mean staleness_max groups_consumed groups_dropped_stale \
           groups_reissued learner_busy_frac; do
  check "metrics carry $key" test "$(grep -c "\"$key\"" run/metrics.jsonl)" -ge 4
done
check "resolved config keeps --set" contains run/config.yaml "steps: 4"
check "samples.jsonl: 4 completions per update (B = 4)" test "$(wc -l < run/samples.jsonl)" -eq 16
for key in step version group worker prompt completion reward; do
  check "samples carry $key" test "$(grep -c "\"$key\"" run/samples.jsonl)" -eq 16
done

# eval on the run's held-out set: last line is {"accuracy": A, "n": N}.
timeout 120 "$ECHELON" eval --checkpoint run/checkpoints/final --data run/heldout.jsonl > eval.out 2> eval.err
check "eval exits 0" test $? -eq 0
check "eval last line is JSON with n" sh -c "tail -n1 eval.out | grep -Eq '^\{\"accuracy\":[0-9.e-]+,\"n\":30\}$'"

# Bad config: unknown key names the file and line.
printf 'rl:\n  steps: 3\n  stepz: 4\n' > bad.yaml
"$ECHELON" train bad.yaml --out run2 > /dev/null 2> bad.err
check "unknown key exits 2" test $? -eq 2
check "unknown key names file:line and key" contains bad.err "bad.yaml:3: unknown config key 'rl.stepz'"
check "nothing written for a bad config" test ! -e run2
"$ECHELON" train "$CONFIG" --out run3 --set rl.lr=fast > /dev/null 2> type.err
check "wrong type names key and expectation" contains type.err "rl.lr = 'fast' is invalid; expected a number"
"$ECHELON" train "$CONFIG" --out run3 --set rl.staleness=-1 > /dev/null 2> range.err
check "out of range names the range" contains range.err "rl.staleness = '-1' is invalid; expected an integer in \[0, 1000\]"

# Non-empty run directory is refused and left alone.
"$ECHELON" train "$CONFIG" --out run "${TINY[@]}" > /dev/null 2> again.err
check "non-empty --out refused" contains again.err "already exists and is not empty"
check "old run untouched" test -s run/checkpoints/final/model.safetensors

# Malformed JSONL names file and line.
printf '{"question": "1+2", "answer": "3"}\n{"question": "1+2" "answer": "3"}\n' > bad.jsonl
"$ECHELON" eval --checkpoint run/checkpoints/final --data bad.jsonl > /dev/null 2> jsonl.err
check "bad jsonl exits non-zero" test $? -ne 0
check "bad jsonl names line 2" contains jsonl.err "bad.jsonl:2"

# Truncated checkpoint is refused with the file named.
cp -r run/checkpoints/final broken
truncate -s 100 broken/model.safetensors
"$ECHELON" eval --checkpoint broken --data run/heldout.jsonl > /dev/null 2> broken.err
check "truncated checkpoint exits non-zero" test $? -ne 0
check "truncated checkpoint names the file" contains broken.err "broken/model.safetensors"
"$ECHELON" eval --checkpoint nowhere --data run/heldout.jsonl > /dev/null 2> missing.err
check "missing checkpoint exits non-zero" test $? -ne 0
check "missing checkpoint names it" contains missing.err "nowhere"

# A learner serving remote actors needs their tokens, or --insecure said out loud.
"$ECHELON" learner "$CONFIG" --out run4 > /dev/null 2> notoken.err
check "learner without --token-file exits 2" test $? -eq 2
check "learner without --token-file says what to do" contains notoken.err "needs --token-file"
# A run open to untrusted workers takes per-worker tokens only, and says how to make them.
"$ECHELON" learner "$CONFIG" --out run4 --insecure rollout.untrusted_workers=true > /dev/null 2> open.err
check "rollout.untrusted_workers refuses --insecure (exit 2)" test $? -eq 2
check "... and says how to issue per-worker tokens" contains open.err "echelon tokens --out DIR --workers N"
echo "0123456789abcdef0123456789abcdef" > shared-token
"$ECHELON" learner "$CONFIG" --out run4 --token-file shared-token rollout.untrusted_workers=true > /dev/null 2> shared.err
check "rollout.untrusted_workers refuses a shared token (exit 2)" test $? -eq 2
check "... naming the file" contains shared.err "shared-token holds one token shared by every worker"
"$ECHELON" tokens --out issued --workers 2 > tokens.out 2>&1
check "echelon tokens exits 0" test $? -eq 0
check "echelon tokens writes the learner's file and one per worker" test -f issued/tokens -a -f issued/worker-0.token -a -f issued/worker-1.token
check "the learner's token file is its owner's alone" test "$(stat -c %a issued/tokens)" = 600
check "each worker's line holds that worker's token" grep -q "^worker-1 $(cat issued/worker-1.token)\$" issued/tokens
echo "short" > short-token
"$ECHELON" learner "$CONFIG" --out run4 --token-file short-token > /dev/null 2> short.err
check "a short token is refused with file and line" contains short.err "short-token:1: token shorter than 16 characters"
"$ECHELON" actor --learner 127.0.0.1:1 --token-file short-token --tls-ca nowhere.pem > /dev/null 2> ca.err
check "unreadable --tls-ca exits 2" test $? -eq 2
check "unreadable --tls-ca is named, no fallback to system roots" contains ca.err "tls-ca nowhere.pem"

# Conventions: --version, usage errors exit 2, bare KEY=VALUE overrides, the run's own log.
"$ECHELON" --version > version.out
check "--version exits 0" test $? -eq 0
check "--version names version, git and LibTorch" grep -Eq '^echelon [0-9]+\.[0-9]+\.[0-9]+ \(git [^,]+, LibTorch [0-9.]+\)$' version.out
check "run's config.yaml records the build" sh -c "head -n1 run/config.yaml | grep -qF \"# \$(cat version.out)\""
check "run's learner.log starts with the build" sh -c "head -n1 run/learner.log | grep -qF \"# \$(cat version.out)\""
check "learner.log holds the progress lines" test "$(grep -c '^step ' run/learner.log)" -eq 4
check "learner.log holds the diagnostics" grep -q "learner listening on" run/learner.log
"$ECHELON" train --no-such-flag > /dev/null 2> usage.err
check "an unknown flag exits 2" test $? -eq 2
check "an unknown flag is named" contains usage.err "not expected: --no-such-flag"
"$ECHELON" --help > help.out
check "--help documents the exit codes" contains help.out "Exit codes: 0 done; 1 the run failed; 2 a usage"
"$ECHELON" > /dev/null 2>&1
check "no subcommand exits 2" test $? -eq 2
"$ECHELON" train "$CONFIG" "$CONFIG" > /dev/null 2> two.err
check "two configs exit 2" test $? -eq 2
check "two configs are named" contains two.err "two configs given"
timeout 300 "$ECHELON" train "$CONFIG" --out run5 "${TINY[@]}" rl.steps=2 eval.every=1 > bare.out 2> bare.err
check "bare overrides run" test $? -eq 0
check "bare overrides apply after --set" test "$(grep -c '^step ' bare.out)" -eq 2
"$ECHELON" train "$CONFIG" --out run6 rl.stepz=2 > /dev/null 2> bare-bad.err
check "a bad bare override exits 2 naming the key" sh -c "grep -q 'rl.stepz' bare-bad.err"

finish
