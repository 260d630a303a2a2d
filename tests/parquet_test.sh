#!/usr/bin/env bash
# echelon's Parquet reader (src/echelon/data/parquet.h) against independent writers: the npm
# packages `parquet-wasm` (arrow-rs compiled to WebAssembly, fed Arrow IPC built with
# `apache-arrow`) and `hyparquet-writer` write the same rows in verl's layout, and
# `echelon_testkit parquet-dump` (tests/tools/parquet_dump.cc) must print exactly the rows of
# the JSONL twin written beside them; then `echelon train` on a prompt set in Parquet holds out
# and trains on the same prompts as on its JSONL twin.
#
#   bash tests/parquet_test.sh ECHELON_BINARY ECHELON_TESTKIT_BINARY [WORK_DIR]
#
# The rows: 50, in verl's layout (data_source, prompt: list<struct<role, content>>, ability,
# reward_model: struct<style, ground_truth>, extra_info: struct<split, index: int64, answer,
# score: double, ok: bool, tags: list<string>, counts: map<string, int32>>), with Unicode,
# quotes, backslashes and newlines in the text, nulls at every level (a null extra_info, null
# fields inside it, a null prompt, an empty prompt, a null message content), one prompt
# longer than 64 KiB, and row groups of 16 rows. The files, each checked by reading its
# footer back with `hyparquet` (every column chunk in the codec named, the page kinds and
# encodings as intended, several row groups, a chunk with several data pages):
#   verl_snappy      SNAPPY, data pages v1, dictionary (falling back to PLAIN when it fills)
#   verl_zstd        ZSTD, data pages v2, dictionary
#   verl_none        UNCOMPRESSED, data pages v1, PLAIN
#   verl_gzip_delta  GZIP, data pages v2, no dictionary: DELTA_BYTE_ARRAY, DELTA_BINARY_PACKED
#   verl_lz4         LZ4_RAW, data pages v1, dictionary
#   verl_hyparquet   hyparquet-writer's own encoder: SNAPPY, data pages v2
# Then corrupt files: truncated, a first magic overwritten, a footer length past the file, a
# page header overwritten, a ZSTD frame's magic flipped; each exits 1 with one error line
# that names the file (and the column, row group and page where it has them). Last, 300
# files with random bytes overwritten (100 each of the SNAPPY, ZSTD and hyparquet-writer
# files): every one ends in rows or in one error line, never a crash or a hang.
# Installs the npm packages into WORK_DIR/parquet_npm (never into the source tree); exits 77
# (CTest "skipped") with a message only when Node/npm are missing or npm cannot install, and
# fails then under CI=true.
set -uo pipefail

USAGE="usage: parquet_test.sh ECHELON_BINARY ECHELON_TESTKIT_BINARY [WORK_DIR]"
ECHELON=$(realpath "${1:?$USAGE}")
DUMP=("$(realpath "${2:?$USAGE}")" parquet-dump)
NPM_DIR="$(realpath "${3:-$(mktemp -d /tmp/parquet_test_npm.XXXXXX)}")/parquet_npm"
PACKAGES="parquet-wasm@0.8.0 apache-arrow@21.2.0 hyparquet@1.33.0 hyparquet-writer@0.17.0"

source "$(dirname "$0")/npm.sh"
# shellcheck disable=SC2086
npm_install_or_skip "$NPM_DIR" "write Parquet files with independent writers" $PACKAGES

source "$(dirname "$0")/lib.sh"
enter_workdir

cat > write_verl.mjs <<'JS'
// node write_verl.mjs OUT_DIR ROWS LONG_CHARS ROW_GROUP: writes the Parquet files listed in
// tests/parquet_test.sh and their twin verl.jsonl into OUT_DIR, then reads every footer back
// with hyparquet and exits 1 if a file is not written the way its name says.
import fs from 'node:fs';
import path from 'node:path';
import * as arrow from 'apache-arrow';
import * as pw from 'parquet-wasm/node';
import { parquetMetadata } from 'hyparquet';
import { parquetWriteBuffer } from 'hyparquet-writer';

const [out, rowsArg, longArg, groupArg] = process.argv.slice(2);
const N = Number(rowsArg), LONG = Number(longArg), GROUP = Number(groupArg);

// Deterministic text: a linear congruential generator over an alphabet with 1- to 4-byte
// UTF-8 characters, quotes, a backslash and control characters.
const ALPHABET = [...'abcdefghij klmnop.,;:—éüñßΩ中文字符数学🍎✓🙂"\\\n\t'];
let seed = 12345;
const nextRandom = () => (seed = (seed * 1103515245 + 12345) % 2147483648);
const text = (chars) => Array.from({ length: chars }, () => ALPHABET[nextRandom() % ALPHABET.length]).join('');

const question = (i) => `Question ${i}: 小明有 ${i} 个苹果 🍎; "quoted" \\ back\\slash\nnext line — ¿cuántos? ${'x'.repeat(i)}`;
const LONG_ROW = 3;
// One row as plain JSON (the twin); counts is an object, index a number.
function row(i) {
  let prompt = [{ role: 'user', content: i === LONG_ROW ? text(LONG) : question(i) }];
  if (i % 5 === 0) prompt.unshift({ role: 'system', content: 'You are a careful solver. 你好' });
  if (i % 13 === 7) prompt[prompt.length - 1].content = null;
  if (i % 10 === 9) prompt = [];
  if (i % 17 === 16) prompt = null;
  const extra = i % 6 === 1 ? null : {
    split: i % 4 === 0 ? 'test' : 'train',
    index: i,
    answer: i % 5 === 2 ? null : `#### ${i * 7}`,
    score: i % 7 === 0 ? null : i * 0.25 - 3,
    ok: i % 3 === 0 ? null : i % 2 === 0,
    tags: i % 4 === 1 ? null : Array.from({ length: i % 4 }, (_, k) => `t${k}✓`),
    counts: i % 8 === 3 ? null : Object.fromEntries(Array.from({ length: i % 3 }, (_, k) => [`k${k}é`, k === 1 && i % 2 ? null : i * 10 + k])),
  };
  return {
    data_source: ['openai/gsm8k', 'DigitalLearningGmbH/MATH-lighteval', 'Ωmega—数学'][i % 3],
    prompt,
    ability: i % 11 === 5 ? null : 'math',
    reward_model: i % 19 === 18 ? null : { style: 'rule', ground_truth: i % 13 === 4 ? null : String(i * 7) },
    extra_info: extra,
  };
}
const rows = Array.from({ length: N }, (_, i) => row(i));
fs.writeFileSync(path.join(out, 'verl.jsonl'), rows.map((r) => JSON.stringify(r) + '\n').join(''));

// ---- parquet-wasm: an Arrow table in IPC, written by arrow-rs ----
const Utf8 = new arrow.Utf8();
const f = (name, type) => new arrow.Field(name, type, true);
const message = new arrow.Struct([f('role', Utf8), f('content', Utf8)]);
const counts = new arrow.Map_(new arrow.Field('entries', new arrow.Struct([new arrow.Field('key', Utf8, false), f('value', new arrow.Int32())]), false));
const extraType = new arrow.Struct([f('split', Utf8), f('index', new arrow.Int64()), f('answer', Utf8), f('score', new arrow.Float64()),
  f('ok', new arrow.Bool()), f('tags', new arrow.List(f('item', Utf8))), f('counts', counts)]);
const arrowExtra = (e) => e && { ...e, index: BigInt(e.index), counts: e.counts && new Map(Object.entries(e.counts)) };
const table = new arrow.Table({
  data_source: arrow.vectorFromArray(rows.map((r) => r.data_source), Utf8),
  prompt: arrow.vectorFromArray(rows.map((r) => r.prompt), new arrow.List(f('item', message))),
  ability: arrow.vectorFromArray(rows.map((r) => r.ability), Utf8),
  reward_model: arrow.vectorFromArray(rows.map((r) => r.reward_model), new arrow.Struct([f('style', Utf8), f('ground_truth', Utf8)])),
  extra_info: arrow.vectorFromArray(rows.map((r) => arrowExtra(r.extra_info)), extraType),
});
const ipc = arrow.tableToIPC(table, 'stream');
const C = pw.Compression;
const wasmFiles = [
  ['verl_snappy', C.SNAPPY, pw.WriterVersion.V1, true],
  ['verl_zstd', C.ZSTD, pw.WriterVersion.V2, true],
  ['verl_none', C.UNCOMPRESSED, pw.WriterVersion.V1, false],
  ['verl_gzip_delta', C.GZIP, pw.WriterVersion.V2, false],
  ['verl_lz4', C.LZ4_RAW, pw.WriterVersion.V1, true],
];
for (const [name, codec, version, dictionary] of wasmFiles) {
  const props = new pw.WriterPropertiesBuilder().setCompression(codec).setWriterVersion(version)
    .setDictionaryEnabled(dictionary).setMaxRowGroupSize(GROUP).setDataPageSizeLimit(1024)
    .setDictionaryPageSizeLimit(512).build();
  fs.writeFileSync(path.join(out, `${name}.parquet`), pw.writeParquet(pw.Table.fromIPCStream(ipc), props));
}

// ---- hyparquet-writer: its own Dremel encoder, page writer and Snappy ----
const opt = (name, extra = {}) => ({ name, repetition_type: 'OPTIONAL', ...extra });
const str = (name) => opt(name, { type: 'BYTE_ARRAY', converted_type: 'UTF8' });
const schema = [
  { name: 'root', num_children: 5 },
  str('data_source'),
  opt('prompt', { converted_type: 'LIST', num_children: 1 }),
  { name: 'list', repetition_type: 'REPEATED', num_children: 1 },
  opt('element', { num_children: 2 }), str('role'), str('content'),
  str('ability'),
  opt('reward_model', { num_children: 2 }), str('style'), str('ground_truth'),
  opt('extra_info', { num_children: 7 }), str('split'), opt('index', { type: 'INT64' }), str('answer'),
  opt('score', { type: 'DOUBLE' }), opt('ok', { type: 'BOOLEAN' }),
  opt('tags', { converted_type: 'LIST', num_children: 1 }), { name: 'list', repetition_type: 'REPEATED', num_children: 1 }, str('element'),
  opt('counts', { converted_type: 'MAP', num_children: 1 }), { name: 'key_value', repetition_type: 'REPEATED', num_children: 2 },
  { name: 'key', type: 'BYTE_ARRAY', converted_type: 'UTF8', repetition_type: 'REQUIRED' }, opt('value', { type: 'INT32' }),
];
const hyExtra = (e) => e && { ...e, index: BigInt(e.index), counts: e.counts && Object.entries(e.counts).map(([key, value]) => ({ key, value })) };
const columns = ['data_source', 'prompt', 'ability', 'reward_model', 'extra_info'];
const buffer = parquetWriteBuffer({
  columnData: columns.map((name) => ({ name, data: rows.map((r) => (name === 'extra_info' ? hyExtra(r.extra_info) : r[name])) })),
  schema, rowGroupSize: GROUP, pageSize: 1024,
});
fs.writeFileSync(path.join(out, 'verl_hyparquet.parquet'), new Uint8Array(buffer));

// ---- every footer read back: the writers did what the names say ----
const expect = {
  verl_snappy: { codec: 'SNAPPY', page: 'DATA_PAGE', dictionary: true },
  verl_zstd: { codec: 'ZSTD', page: 'DATA_PAGE_V2', dictionary: true },
  verl_none: { codec: 'UNCOMPRESSED', page: 'DATA_PAGE', dictionary: false },
  verl_gzip_delta: { codec: 'GZIP', page: 'DATA_PAGE_V2', dictionary: false, encodings: ['DELTA_BYTE_ARRAY', 'DELTA_BINARY_PACKED'] },
  verl_lz4: { codec: 'LZ4_RAW', page: 'DATA_PAGE', dictionary: true },
  verl_hyparquet: { codec: 'SNAPPY', page: 'DATA_PAGE_V2' },
};
let failures = 0;
const check = (ok, what) => { if (!ok) { failures++; console.log(`FAIL: ${what}`); } };
for (const [name, want] of Object.entries(expect)) {
  const bytes = fs.readFileSync(path.join(out, `${name}.parquet`));
  const meta = parquetMetadata(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength));
  const chunks = meta.row_groups.flatMap((g) => g.columns.map((c) => c.meta_data));
  const codecs = new Set(chunks.map((m) => m.codec));
  const stats = chunks.flatMap((m) => m.encoding_stats ?? []);
  const pages = new Set(stats.filter((s) => s.page_type !== 'DICTIONARY_PAGE').map((s) => s.page_type));
  const encodings = new Set(chunks.flatMap((m) => m.encodings));
  check(codecs.size === 1 && codecs.has(want.codec), `${name}: every column chunk in ${want.codec} (${[...codecs]})`);
  check(pages.size === 1 && pages.has(want.page), `${name}: data pages are ${want.page} (${[...pages]})`);
  check(Number(meta.num_rows) === N && meta.row_groups.length === Math.ceil(N / GROUP), `${name}: ${N} rows in ${Math.ceil(N / GROUP)} row groups`);
  if (want.dictionary !== undefined)
    check(stats.some((s) => s.page_type === 'DICTIONARY_PAGE') === want.dictionary, `${name}: dictionary pages ${want.dictionary ? '' : 'not '}used`);
  for (const e of want.encodings ?? []) check(encodings.has(e), `${name}: ${e} used (${[...encodings]})`);
  if (name === 'verl_snappy') {
    check(chunks.some((m) => stats.length && (m.encoding_stats ?? []).filter((s) => s.page_type === 'DATA_PAGE').reduce((a, s) => a + s.count, 0) > 1),
          `${name}: a column chunk with several data pages`);
    check(encodings.has('PLAIN') && encodings.has('RLE_DICTIONARY'), `${name}: dictionary and PLAIN fallback pages`);
  }
  console.log(`${name}: ${[...codecs]} ${[...pages]} ${[...encodings]}, ${meta.row_groups.length} row groups`);
}
process.exit(failures === 0 ? 0 : 1);
JS

cat > compare.mjs <<'JS'
// node compare.mjs WANT.jsonl GOT.jsonl: the same rows, as JSON values (key order aside).
import fs from 'node:fs';
const read = (p) => fs.readFileSync(p, 'utf8').split('\n').filter((l) => l !== '').map((l) => JSON.parse(l));
const [want, got] = process.argv.slice(2).map(read);
const diff = (a, b, at) => {
  if (a === null || b === null || typeof a !== 'object' || typeof b !== 'object')
    return a === b ? null : `${at}: want ${JSON.stringify(a)?.slice(0, 80)}, got ${JSON.stringify(b)?.slice(0, 80)}`;
  if (Array.isArray(a) !== Array.isArray(b)) return `${at}: array vs object`;
  const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
  if (Array.isArray(a) && a.length !== b.length) return `${at}: ${a.length} vs ${b.length} elements`;
  for (const k of keys) {
    if (!(k in a) || !(k in b)) return `${at}.${k}: present in only one`;
    const d = diff(a[k], b[k], `${at}.${k}`);
    if (d) return d;
  }
  return null;
};
let bad = 0;
if (want.length !== got.length) { console.log(`want ${want.length} rows, got ${got.length}`); bad++; }
for (let i = 0; i < Math.min(want.length, got.length); i++) {
  const d = diff(want[i], got[i], `row ${i}`);
  if (d && bad++ < 3) console.log(d);
}
process.exit(bad === 0 ? 0 : 1);
JS

cat > corrupt.mjs <<'JS'
// node corrupt.mjs IN OUT KIND [SEEDS]: a corrupt copy of IN.
//   footer   the footer length set past the file
//   header   the first data page header of prompt's content column (row group 0) overwritten with 0xFF
//   zstd     the first ZSTD frame magic inside that column chunk flipped
//   random   OUT-SEED.parquet for SEED in 1..SEEDS: 1-8 bytes replaced at positions the seed picks
//            (between the magic numbers, so that the damage reaches the footer and the pages)
import fs from 'node:fs';
import { parquetMetadata } from 'hyparquet';
const [input, output, kind, seedArg] = process.argv.slice(2);
const b = Buffer.from(fs.readFileSync(input));
const meta = parquetMetadata(b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength));
const content = meta.row_groups[0].columns.find((c) => c.meta_data.path_in_schema.at(-1) === 'content').meta_data;
const start = Number(content.data_page_offset);
if (kind === 'footer') b.writeUInt32LE(b.length, b.length - 8);
if (kind === 'header') b.fill(0xff, start, start + 8);
if (kind === 'zstd') {
  const at = b.indexOf(Buffer.from([0x28, 0xb5, 0x2f, 0xfd]), start);
  if (at < 0 || at > start + Number(content.total_compressed_size)) throw new Error('no ZSTD frame in the chunk');
  b[at] ^= 0xff;
}
if (kind === 'random') {
  for (let seed = 1; seed <= Number(seedArg); seed++) {
    const r = Buffer.from(b);
    let s = seed * 7919 + 1;
    const next = () => (s = (s * 1103515245 + 12345) % 2147483648);
    const count = 1 + (next() % 8);
    for (let k = 0; k < count; k++) r[4 + (next() % (r.length - 8))] = next() % 256;
    fs.writeFileSync(`${output}-${seed}.parquet`, r);
  }
} else {
  fs.writeFileSync(output, b);
}
JS
ln -s "$NPM_DIR/node_modules" node_modules  # ES modules resolve packages from the script's directory up

timeout 120 node write_verl.mjs . 50 70000 16 > write.out 2>&1
check "the writers wrote the files as intended (footers read back with hyparquet)" test $? -eq 0
cat write.out
check "the long prompt is over 64 KiB" test "$(sed -n 4p verl.jsonl | wc -c)" -gt 65536

for name in verl_snappy verl_zstd verl_none verl_gzip_delta verl_lz4 verl_hyparquet; do
  timeout 60 "${DUMP[@]}" "$name.parquet" > "$name.out" 2> "$name.err"
  RC=$?
  check "$name: parquet_dump exits 0" test "$RC" -eq 0
  [ "$RC" -eq 0 ] || head -c 500 "$name.err"
  timeout 60 node compare.mjs verl.jsonl "$name.out"
  check "$name: rows equal the JSONL twin" test $? -eq 0
done

# one_error FILE PATTERN: parquet_dump FILE exits 1 with one stderr line naming FILE and matching PATTERN.
one_error() {
  timeout 60 "${DUMP[@]}" "$1" > /dev/null 2> "$1.err"
  local rc=$?
  [ "$rc" -eq 1 ] && [ "$(wc -l < "$1.err")" -eq 1 ] && grep -q "^$1: " "$1.err" && grep -qE "$2" "$1.err" ||
    { echo "exit $rc: $(head -c 300 "$1.err")"; return 1; }
}
head -c 30000 verl_snappy.parquet > truncated.parquet
check "a truncated file is one error" one_error truncated.parquet "does not end with PAR1"
node corrupt.mjs verl_snappy.parquet footer.parquet footer
check "a footer length past the file is one error" one_error footer.parquet "footer length [0-9]+ runs past"
node corrupt.mjs verl_snappy.parquet header.parquet header
# Page 0 of the chunk is its dictionary page; the header overwritten is page 1's.
check "an overwritten page header is one error naming column, row group and page" \
  one_error header.parquet "corrupt page header.*\(column prompt\.list\.item\.content, row group 0, page 1\)"
node corrupt.mjs verl_zstd.parquet zstd.parquet zstd
check "a flipped ZSTD frame is one error naming column, row group and page" \
  one_error zstd.parquet "ZSTD data is corrupt.*\(column prompt\.list\.item\.content, row group 0, page [0-9]+\)"
cp verl_snappy.parquet missing_magic.parquet && printf 'XXXX' | dd of=missing_magic.parquet conv=notrunc status=none
check "a file not starting with PAR1 is one error" one_error missing_magic.parquet "does not start with PAR1"

# Random damage: rows or one error line, never a crash (exit >= 128), a hang (124) or a
# multi-line message.
crashes=0 errors=0
for src in verl_snappy verl_zstd verl_hyparquet; do
  node corrupt.mjs "$src.parquet" "random_$src" random 100
done
for f in random_*.parquet; do
  timeout 20 "${DUMP[@]}" "$f" > /dev/null 2> random.err
  rc=$?
  if [ "$rc" -eq 1 ] && [ "$(wc -l < random.err)" -eq 1 ] && grep -q "^$f: " random.err; then
    errors=$((errors + 1))
  elif [ "$rc" -ne 0 ]; then
    crashes=$((crashes + 1))
    echo "$f: exit $rc: $(head -c 300 random.err)"
  fi
done
echo "random damage: $errors of 300 files refused with one error, the rest read"
check "random damage never crashes, hangs or prints more than one line" test "$crashes" -eq 0
check "random damage is mostly caught" test "$errors" -ge 100

# ---- A prompt set in Parquet (ZSTD, as verl's preprocessing scripts write it) trains ----
for i in $(seq 0 199); do
  a=$((i % 20)); b=$((i / 20))
  printf '{"data_source": "toy", "prompt": [{"role": "user", "content": "What is %d+%d?"}], "ability": "math", "reward_model": {"style": "rule", "ground_truth": "%d"}, "extra_info": {"split": "train", "index": %d}}\n' $a $b $((a + b)) $i
done > prompts.jsonl
cat > write_prompts.mjs <<'JS'
// node write_prompts.mjs IN.jsonl OUT.parquet: the rows in verl's layout, ZSTD, by arrow-rs.
import fs from 'node:fs';
import * as arrow from 'apache-arrow';
import * as pw from 'parquet-wasm/node';
const [input, output] = process.argv.slice(2);
const rows = fs.readFileSync(input, 'utf8').split('\n').filter((l) => l.trim() !== '').map((l) => JSON.parse(l));
const Utf8 = new arrow.Utf8();
const f = (name, type) => new arrow.Field(name, type, true);
const table = new arrow.Table({
  data_source: arrow.vectorFromArray(rows.map((r) => r.data_source), Utf8),
  prompt: arrow.vectorFromArray(rows.map((r) => r.prompt), new arrow.List(f('item', new arrow.Struct([f('role', Utf8), f('content', Utf8)])))),
  ability: arrow.vectorFromArray(rows.map((r) => r.ability), Utf8),
  reward_model: arrow.vectorFromArray(rows.map((r) => r.reward_model), new arrow.Struct([f('style', Utf8), f('ground_truth', Utf8)])),
  extra_info: arrow.vectorFromArray(rows.map((r) => ({ ...r.extra_info, index: BigInt(r.extra_info.index) })),
                                    new arrow.Struct([f('split', Utf8), f('index', new arrow.Int64())])),
});
const props = new pw.WriterPropertiesBuilder().setCompression(pw.Compression.ZSTD).setMaxRowGroupSize(64).build();
fs.writeFileSync(output, pw.writeParquet(pw.Table.fromIPCStream(arrow.tableToIPC(table, 'stream')), props));
JS
timeout 60 node write_prompts.mjs prompts.jsonl prompts.parquet
check "the prompt set is written as Parquet" test -s prompts.parquet
for data in prompts.jsonl prompts.parquet; do
  cat > "train-$data.yaml" <<YAML
task: {name: prompts, train_file: $PWD/$data, reward: math}
$TINY_MODEL_YAML
warmstart: {steps: 5}
rl: {steps: 2, groups_per_step: 2, group_size: 4}
rollout: {actors: 1, max_new_tokens: 4}
eval: {every: 0}
YAML
  timeout 300 "$ECHELON" train "train-$data.yaml" --out "run-$data" > "train-$data.out" 2> "train-$data.err"
  RC=$?
  check "echelon train on $data exits 0" test "$RC" -eq 0
  [ "$RC" -eq 0 ] || tail -n 5 "train-$data.err"
done
check "Parquet and JSONL hold out the same prompts" \
  diff <(jq -cS '.prompt' run-prompts.jsonl/heldout.jsonl) <(jq -cS '.prompt' run-prompts.parquet/heldout.jsonl)
# A group's prompt is a function of its id (the seeded shuffle of the rows): every group both
# runs logged has the same prompt in both.
check "Parquet and JSONL give each group the same prompt" /usr/bin/python3 -c "
import json, sys
def load(p): return {j['group']: j['prompt'] for j in map(json.loads, open(p))}
a, b = load('run-prompts.jsonl/samples.jsonl'), load('run-prompts.parquet/samples.jsonl')
both = set(a) & set(b)
sys.exit(0 if both and all(a[g] == b[g] for g in both) else 1)"

finish
