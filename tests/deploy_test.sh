#!/usr/bin/env bash
# System test of the deployment files against the binary they launch:
#   deploy/k8s/*.yaml and deploy/slurm/*.sbatch: tests/deploy_check.py (python3-yaml) checks the
#     kinds, that every `echelon SUB --flag` is a flag `echelon SUB --help` lists, that tokens
#     come from Secret volumes and are never written into the files; `bash -n` on the scripts.
#   deploy/slurm/echelon.sbatch run for real on this host, with `srun` and `scontrol` standing in
#     for Slurm's (a 3-node allocation: a learner task, two actor tasks): the run finishes, each
#     actor task presented a token of its own (two workers in the learner's metrics), and the
#     token directory is owner-only.
#   Dockerfile (docker cannot run here): parsed by dockerfile-ast, the parser of the VS Code
#     Docker language service (pinned npm package, installed under BUILD_DIR): multi-stage, the
#     build stage runs scripts/install-deps.sh, the final stage installs the .deb from the build
#     stage with apt and no compiler or CMake, and its ENTRYPOINT is echelon; .dockerignore
#     keeps build trees and runs out of the context.
# Usage: tests/deploy_test.sh path/to/echelon BUILD_DIR
set -uo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/npm.sh"  # and skip.sh
ECHELON=$(realpath "$1")
BUILD=$(realpath "$2")
ROOT=$(realpath "$(dirname "$0")/..")
NPM_DIR=$BUILD/deploy_npm
python3 -c 'import yaml' 2> /dev/null || skip_or_fail "python3-yaml is needed (scripts/install-deps.sh)"
npm_install_or_skip "$NPM_DIR" "parse the Dockerfile" dockerfile-ast@0.7.1
enter_workdir

# Every subcommand's --help, for the flag check.
mkdir help
"$ECHELON" --help > help/echelon.help 2>&1
subs=$(sed -n '/^Subcommands:/,$p' help/echelon.help | sed -n 's/^  \([a-z][a-z-]*\) .*/\1/p')
check "echelon --help lists learner and actor" sh -c "echo '$subs' | grep -qx learner && echo '$subs' | grep -qx actor"
for s in $subs; do "$ECHELON" "$s" --help > "help/$s.help" 2>&1; done

check "deployment files match the binary's flags, every actor replica its own token" \
  python3 "$ROOT/tests/deploy_check.py" help "$ROOT" "$ECHELON"
for f in "$ROOT"/deploy/slurm/*.sbatch; do
  check "bash -n $(basename "$f")" bash -n "$f"
done

# ---- The Slurm script, run here: srun starts --ntasks copies of its command on this host ----
mkdir -p slurm/bin
ln -s "$ECHELON" slurm/bin/echelon
cat > slurm/bin/scontrol <<'EOF'
#!/usr/bin/env bash
# scontrol show hostnames LIST: this allocation's nodes, as addresses of this host.
printf '%s\n' 127.0.0.1 127.0.0.2 127.0.0.3
EOF
cat > slurm/bin/srun <<'EOF'
#!/usr/bin/env bash
# srun [--OPTION=VALUE ...] COMMAND ARGS...: --ntasks copies of COMMAND here, task i with
# SLURM_PROCID=i on "node" 127.0.0.(2+i); TERM is passed on.
n=1
while [[ "$1" == --* ]]; do
  case "$1" in --ntasks=*) n=${1#--ntasks=} ;; esac
  shift
done
pids=()
for ((i = 0; i < n; i++)); do
  SLURM_PROCID=$i SLURMD_NODENAME=127.0.0.$((i + 2)) "$@" &
  pids+=($!)
done
trap 'kill -TERM "${pids[@]}" 2> /dev/null' TERM INT
rc=0
for p in "${pids[@]}"; do
  while kill -0 "$p" 2> /dev/null; do wait "$p" || rc=$?; done
done
exit $rc
EOF
chmod +x slurm/bin/scontrol slurm/bin/srun
SLURM_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
(cd slurm && PATH="$PWD/bin:$PATH" SLURM_JOB_NODELIST='node[0-2]' SLURM_JOB_NAME=t SLURM_SUBMIT_DIR="$PWD" \
  SLURM_CPUS_PER_TASK=1 ECHELON_PORT=$SLURM_PORT timeout 300 bash "$ROOT/deploy/slurm/echelon.sbatch" \
  "$ROOT/configs/math-tiny.yaml" warmstart.steps=5 rl.steps=30 rl.groups_per_step=4 rollout.wait_for_actors=2 task.eval_size=20 eval.every=0 \
  model.num_hidden_layers=1 > sbatch.out 2> sbatch.err)
check "the Slurm script's run finishes (exit 0)" test $? -eq 0
check "the Slurm run wrote its final checkpoint" test -d slurm/runs/echelon-t/checkpoints/final
final=$(tail -n 1 slurm/runs/echelon-t/metrics.jsonl 2> /dev/null)
check "each actor task was a worker of its own (slurm-actor-0 and -1 in actor_groups)" \
  jq -e '.actor_groups | has("slurm-actor-0") and has("slurm-actor-1")' <<< "$final" > /dev/null
check "the token directory is owner-only" test "$(stat -c %a slurm/runs/echelon-t.tokens)" = 700
check "each token file is owner-only" test "$(stat -c %a slurm/runs/echelon-t.tokens/slurm-actor-1.token)" = 600
[ "$fails" -ne 0 ] && tail -n 20 slurm/sbatch.out slurm/sbatch.err

cat > dockerfile_check.js <<'EOF'
// node dockerfile_check.js DOCKERFILE: one "FAIL: ..." line per failed check.
const { DockerfileParser } = require('dockerfile-ast');
const fs = require('fs');
const df = DockerfileParser.parse(fs.readFileSync(process.argv[2], 'utf8'));
const fails = [];
const expect = (cond, msg) => { if (!cond) fails.push(msg); };
const stages = [];
for (const ins of df.getInstructions()) {
  if (ins.getKeyword() === 'FROM') stages.push({ from: ins, body: [] });
  else if (stages.length) stages[stages.length - 1].body.push(ins);
  else expect(ins.getKeyword() === 'ARG', 'instruction before the first FROM: ' + ins.getKeyword());
}
const words = (ins) => ins.getArguments().map((a) => a.getValue());
const runs = (stage) => stage.body.filter((i) => i.getKeyword() === 'RUN').map((i) => words(i).join(' '));
expect(stages.length >= 2, 'not multi-stage: ' + stages.length + ' FROM');
for (const s of stages) expect(/^debian:12(\b|$)/.test(s.from.getImage() || ''), 'FROM ' + s.from.getImage() + ' is not debian:12');
const build = stages[0], last = stages[stages.length - 1];
const name = build.from.getBuildStage();
expect(name, 'the build stage has no name (FROM ... AS NAME)');
expect(runs(build).some((r) => /scripts\/install-deps\.sh/.test(r)), 'the build stage does not run scripts/install-deps.sh');
expect(runs(build).some((r) => /cmake --build/.test(r)), 'the build stage does not build');
expect(runs(build).some((r) => /cpack -G DEB/.test(r)), 'the build stage does not make the .deb');
const copies = last.body.filter((i) => i.getKeyword() === 'COPY');
expect(copies.some((c) => c.getFlags().some((f) => f.toString() === '--from=' + name) && /\.deb$/.test(words(c)[0])),
       'the final stage copies no .deb from the build stage');
expect(runs(last).some((r) => /apt-get install .*\.deb/.test(r)), 'the final stage does not install the .deb with apt');
for (const r of runs(last)) {
  for (const bad of ['build-essential', 'cmake', 'g++', 'gcc', 'clang', 'install-deps.sh', '-dev'])
    expect(!r.split(/\s+/).some((w) => w === bad || (bad === '-dev' && /-dev$/.test(w))), 'the final stage installs ' + bad + ': ' + r);
}
expect(!last.body.some((i) => i.getKeyword() === 'COPY' && !i.getFlags().length), 'the final stage copies from the context');
const eps = last.body.filter((i) => i.getKeyword() === 'ENTRYPOINT');
expect(eps.length === 1, 'the final stage has ' + eps.length + ' ENTRYPOINT');
if (eps.length) {
  const json = eps[0].getJSONStrings().map((a) => a.getJSONValue());
  expect(json.length === 1 && /(^|\/)echelon$/.test(json[0]), 'ENTRYPOINT is not ["echelon"]: ' + eps[0].getArgumentsContent());
}
expect(!last.body.some((i) => i.getKeyword() === 'USER' && /^(0|root)(:|$)/.test(words(i)[0] || '')), 'the final stage runs as root');
for (const f of fails) console.log('FAIL: ' + f);
console.log('dockerfile_check: ' + stages.length + ' stages, ' + fails.length + ' failed');
process.exit(fails.length ? 1 : 0);
EOF
check "Dockerfile: multi-stage, no compiler in the final stage, ENTRYPOINT echelon" \
  env NODE_PATH="$NPM_DIR/node_modules" node dockerfile_check.js "$ROOT/Dockerfile"

# The context leaves out what the image builds itself.
for p in .git build 'build-*' runs; do
  check ".dockerignore leaves out $p" grep -qxF -- "$p" "$ROOT/.dockerignore"
done
# Whatever the Dockerfile COPYs from the context exists.
check "Dockerfile copies scripts/install-deps.sh" test -f "$ROOT/scripts/install-deps.sh"

finish
