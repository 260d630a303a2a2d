#!/usr/bin/env bash
# The TensorBoard event files of a run, read by an independent reader: the npm package
# `tfrecord` (TFRecord framing, both CRC32Cs checked) and `protobufjs` decoding Event /
# Summary / SessionLog with a schema written here from TensorFlow's event.proto and
# summary.proto.
#
#   bash tests/tensorboard_test.sh ECHELON_BINARY [WORK_DIR]
#
# Part 1: `echelon train` for 6 updates. The run directory holds one
# events.out.tfevents.<unix seconds>.<hostname>; its first record is file_version
# "brain.Event:2", then one Event per metrics.jsonl line, in order: its step is the line's
# "step" (else "version", else 0), its wall time the real unix time, its values exactly the
# line's numbers (top-level numbers by key, numbers of an object as key/k, "step" left out),
# equal as float32.
# Part 2: the run resumed to 8 updates adds a second event file that opens with a SessionLog
# START at the checkpoint's version; read the way TensorBoard reads a directory (files in name
# order, a START dropping the points at its step and after), the event files equal the whole
# metrics.jsonl line for line.
# Installs the npm packages into WORK_DIR/tensorboard_npm (never into the source tree); exits 77
# (CTest "skipped") with a message only when Node/npm are missing or npm cannot install, and
# fails then under CI=true.
set -uo pipefail

ECHELON=$(realpath "${1:?usage: tensorboard_test.sh ECHELON_BINARY [WORK_DIR]}")
NPM_DIR="$(realpath "${2:-$(mktemp -d /tmp/tensorboard_test_npm.XXXXXX)}")/tensorboard_npm"
CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")
PACKAGES="tfrecord@0.2.0 protobufjs@7.5.4"

source "$(dirname "$0")/npm.sh"
# shellcheck disable=SC2086
npm_install_or_skip "$NPM_DIR" "read the event files with an independent TFRecord reader" $PACKAGES

source "$(dirname "$0")/lib.sh"
enter_workdir

TINY=(--set model.hidden_size=32 --set model.num_hidden_layers=1 --set model.num_attention_heads=2
      --set model.num_key_value_heads=1 --set model.head_dim=16 --set model.intermediate_size=64
      --set warmstart.steps=5 --set rl.groups_per_step=4 --set task.eval_size=30 --set eval.every=2
      --set checkpoint.every=3)

cat > read_events.mjs <<'JS'
// node read_events.mjs RUN_DIR METRICS_JSONL T0 T1 EXPECT_FILES: checks the event files of
// RUN_DIR against METRICS_JSONL (see tests/tensorboard_test.sh); wall times within [T0, T1].
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import tfrecord from 'tfrecord';
import protobuf from 'protobufjs';

const [dir, metricsPath, t0, t1, expectFiles] = process.argv.slice(2);
let failures = 0;
const check = (ok, name, detail = '') => {
  if (!ok) {
    failures++;
    console.log(`FAIL: ${name}${detail ? ` (${detail})` : ''}`);
  }
};

// From tensorflow/core/util/event.proto and tensorflow/core/framework/summary.proto.
const root = protobuf.parse(`
  syntax = "proto3";
  package tb;
  message Event {
    double wall_time = 1;
    int64 step = 2;
    oneof what {
      string file_version = 3;
      bytes graph_def = 4;
      Summary summary = 5;
      SessionLog session_log = 7;
    }
  }
  message Summary {
    message Value {
      string node_name = 7;
      string tag = 1;
      oneof value { float simple_value = 2; bytes obsolete_old_style_histogram = 3; TensorProto tensor = 8; }
      SummaryMetadata metadata = 9;
    }
    repeated Value value = 1;
  }
  message TensorShapeProto {}
  message TensorProto {
    int32 dtype = 1;
    TensorShapeProto tensor_shape = 2;
    repeated bytes string_val = 8;
  }
  message SummaryMetadata {
    message PluginData { string plugin_name = 1; bytes content = 2; }
    PluginData plugin_data = 1;
  }
  message SessionLog {
    enum SessionStatus { STATUS_UNSPECIFIED = 0; START = 1; STOP = 2; CHECKPOINT = 3; }
    SessionStatus status = 1;
    string checkpoint_path = 2;
    string msg = 3;
  }
`, { keepCase: true }).root;
const Event = root.lookupType('tb.Event');

// The metrics lines, flattened by the rule the event files follow.
const lines = fs.readFileSync(metricsPath, 'utf8').split('\n').filter((l) => l.trim() !== '').map((l) => JSON.parse(l));
const isNum = (v) => typeof v === 'number' && Number.isFinite(v);
const flatten = (line) => {
  const out = new Map();
  for (const [k, v] of Object.entries(line)) {
    if (k === 'step') continue;
    if (isNum(v)) out.set(k, v);
    else if (v !== null && typeof v === 'object' && !Array.isArray(v))
      for (const [kk, vv] of Object.entries(v)) if (isNum(vv)) out.set(`${k}/${kk}`, vv);
  }
  return out;
};
const stepOf = (line) => (Number.isInteger(line.step) ? line.step : Number.isInteger(line.version) ? line.version : 0);
const want = lines.map((l) => ({ step: stepOf(l), values: flatten(l) })).filter((w) => w.values.size > 0);

const files = fs.readdirSync(dir).filter((f) => f.includes('tfevents')).sort();
check(files.length === Number(expectFiles), `${expectFiles} event file(s)`, files.join(' '));
const host = os.hostname();
let got = [];  // the scalar events TensorBoard keeps, in order
let texts = [];  // the text events it keeps: {step, text}
let records = 0, purges = 0, dropped = 0, droppedTexts = 0, textRecords = 0;
for (const name of files) {
  const m = /^events\.out\.tfevents\.(\d+)\.(.+)$/.exec(name);
  check(m !== null && (m[2] === host || m[2].startsWith(`${host}.`)), 'name is events.out.tfevents.<secs>.<hostname>', name);
  if (m) check(Number(m[1]) >= Number(t0) - 1 && Number(m[1]) <= Number(t1) + 1, 'name carries the unix seconds', name);
  const reader = await tfrecord.RecordReader.create(path.join(dir, name));
  let first = true;
  let lastWall = 0;
  for (;;) {
    let data;
    try {
      data = await reader.readRecord();
    } catch (e) {
      check(false, `${name}: record ${records} reads (CRCs)`, e.message);
      break;
    }
    if (data === null) break;
    records++;
    const ev = Event.toObject(Event.decode(data), { longs: Number, enums: String });
    ev.step ??= 0;  // proto3 leaves zeros off the wire
    check(ev.wall_time >= Number(t0) - 1 && ev.wall_time <= Number(t1) + 1, `${name}: wall time is unix time`, String(ev.wall_time));
    check(ev.wall_time >= lastWall, `${name}: wall times do not go back`);
    lastWall = ev.wall_time;
    if (first) {
      check(ev.file_version === 'brain.Event:2', `${name}: first record is file_version brain.Event:2`, JSON.stringify(ev));
      first = false;
      continue;
    }
    if (ev.session_log) {
      check(ev.session_log.status === 'START', `${name}: session log is START`, JSON.stringify(ev));
      const kept = got.filter((g) => g.step < ev.step);
      dropped += got.length - kept.length;
      got = kept;
      const keptTexts = texts.filter((t) => t.step < ev.step);
      droppedTexts += texts.length - keptTexts.length;
      texts = keptTexts;
      purges++;
      continue;
    }
    check(ev.summary !== undefined && ev.file_version === undefined, `${name}: a summary event`, JSON.stringify(ev));
    const first_value = ev.summary?.value?.[0];
    if (first_value?.metadata !== undefined) {
      textRecords++;
      check(ev.summary.value.length === 1 && first_value.tag === 'samples', `${name}: one text value tagged samples`);
      check(first_value.metadata.plugin_data?.plugin_name === 'text', `${name}: text plugin`, JSON.stringify(first_value.metadata));
      check(first_value.tensor?.dtype === 7 && first_value.tensor.string_val.length === 1, `${name}: one DT_STRING`);
      texts.push({ step: ev.step, text: Buffer.from(first_value.tensor?.string_val?.[0] ?? []).toString('utf8') });
      continue;
    }
    const values = new Map();
    for (const v of ev.summary?.value ?? []) {
      check(!values.has(v.tag), `${name}: tag ${v.tag} once per event`);
      values.set(v.tag, v.simple_value);
    }
    got.push({ step: ev.step, values });
  }
  await reader.close();
}
check(purges === Number(expectFiles) - 1, 'one SessionLog START per resumed process', String(purges));
// The lines a resume cut from metrics.jsonl are the events a START dropped.
const discardedPath = path.join(dir, 'metrics.discarded.jsonl');
const discarded = fs.existsSync(discardedPath)
  ? fs.readFileSync(discardedPath, 'utf8').split('\n').filter((l) => l.trim() !== '' && flatten(JSON.parse(l)).size > 0).length
  : 0;
check(dropped === discarded, 'the events dropped are the lines moved to metrics.discarded.jsonl', `${dropped} vs ${discarded}`);
// samples.jsonl: one text event per step that has samples, holding each sample's completion.
const readLines = (p) => fs.existsSync(p) ? fs.readFileSync(p, 'utf8').split('\n').filter((l) => l.trim() !== '').map((l) => JSON.parse(l)) : [];
const samples = readLines(path.join(dir, 'samples.jsonl'));
const sampleSteps = [...new Set(samples.map((s) => s.step))];
const discardedSteps = new Set(readLines(path.join(dir, 'samples.discarded.jsonl')).map((s) => s.step)).size;
check(droppedTexts === discardedSteps, 'the text events dropped are the steps moved to samples.discarded.jsonl', `${droppedTexts} vs ${discardedSteps}`);
check(texts.length === sampleSteps.length && texts.every((t, i) => t.step === sampleSteps[i]),
      'one text event per step of samples.jsonl, in order', `${texts.map((t) => t.step)} vs ${sampleSteps}`);
for (const s of samples) {
  const t = texts.find((x) => x.step === s.step);
  check(t !== undefined && t.text.includes(`**group ${s.group}**`) && t.text.includes(s.completion),
        `step ${s.step}: the text holds group ${s.group} and its completion`);
}
check(records === files.length + purges + want.length + discarded + textRecords,
      'record count: file versions + session starts + one per line, discarded lines included, + text events',
      `${records} records, ${want.length} lines, ${discarded} discarded, ${files.length} files, ${textRecords} texts`);
check(textRecords === texts.length + droppedTexts, 'every text event read is kept or dropped by a START');
check(got.length === want.length, 'one event per metrics line', `${got.length} vs ${want.length}`);
for (let i = 0; i < Math.min(got.length, want.length); i++) {
  const g = got[i], w = want[i];
  check(g.step === w.step, `line ${i + 1}: step`, `${g.step} vs ${w.step}`);
  check(g.values.size === w.values.size, `line ${i + 1}: the same tags`,
        `${[...g.values.keys()].sort()} vs ${[...w.values.keys()].sort()}`);
  for (const [tag, v] of w.values) {
    const f = Math.fround(v);
    check(g.values.get(tag) === f, `line ${i + 1}: ${tag} equals ${v} as float32`, String(g.values.get(tag)));
  }
}
console.log(`${records} records in ${files.length} file(s), ${got.length} metrics lines and ${texts.length} sample texts checked, ${dropped} + ${droppedTexts} dropped by a resume`);
process.exit(failures === 0 ? 0 : 1);
JS
ln -s "$NPM_DIR/node_modules" node_modules  # ES modules resolve packages from the script's directory up

# ---- Part 1: a fresh run ----
T0=$(date +%s)
timeout 300 "$ECHELON" train "$CONFIG" --out run "${TINY[@]}" --set rl.steps=6 > train.out 2> train.err
RC=$?
check "train exits 0" test "$RC" -eq 0
[ "$RC" -eq 0 ] || tail -n 20 train.err
T1=$(date +%s)
check "six step lines" test "$(grep -c '"step"' run/metrics.jsonl)" -eq 6
check "held-out accuracy in step lines" \
  test "$(jq -s '[.[] | select(.step != null and .heldout_accuracy != null)] | length' run/metrics.jsonl)" -ge 2
timeout 120 node read_events.mjs run run/metrics.jsonl "$T0" "$T1" 1 > read1.out 2>&1
check "event file matches metrics.jsonl" test $? -eq 0
cat read1.out

# ---- Part 2: resumed to 8 updates ----
sleep 1  # the second file's name differs in its seconds (a suffix would do as well)
timeout 300 "$ECHELON" train --resume run --set rl.steps=8 > resume.out 2> resume.err
RC=$?
check "resumed train exits 0" test "$RC" -eq 0
[ "$RC" -eq 0 ] || tail -n 20 resume.err
T2=$(date +%s)
check "resume line written" grep -q '"event":"resume"' run/metrics.jsonl
check "eight step lines" test "$(grep -c '"step"' run/metrics.jsonl)" -eq 8
timeout 120 node read_events.mjs run run/metrics.jsonl "$T0" "$T2" 2 > read2.out 2>&1
check "event files, read as TensorBoard does, match metrics.jsonl" test $? -eq 0
cat read2.out

finish
