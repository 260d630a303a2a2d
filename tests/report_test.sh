#!/usr/bin/env bash
# System test of `echelon report`: two tiny real runs (S = 0 and S = 2, heterogeneous actors,
# in-process threads) rendered into one report, opened in headless Chromium. Checks that every
# <svg class="chart"> in the rendered DOM has a data mark with finite coordinates, that a
# screenshot is not blank (many distinct colours, the series colours present), and that bad
# input gives one clear error naming the directory or file:line.
# Installs Debian's `chromium` with apt-get when it is missing; exits 77 (skipped) only when
# it cannot be installed, and fails then under CI=true.
# Usage: tests/report_test.sh path/to/echelon     (REPORT_TEST_KEEP=DIR keeps the artefacts)
set -uo pipefail
ECHELON=$(realpath "$1")
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cd "$WORK"
fails=0
pass=0
check() {  # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then pass=$((pass + 1)); else echo "FAIL: $name"; fails=$((fails + 1)); fi
}
contains() { grep -q -- "$2" "$1"; }

if ! command -v chromium > /dev/null; then
  echo "installing chromium (apt-get)"
  { apt-get install -y --no-install-recommends chromium || { apt-get update && apt-get install -y --no-install-recommends chromium; }; } \
    > apt.log 2>&1
  if ! command -v chromium > /dev/null; then
    tail -3 apt.log
    source "$HERE/skip.sh"
    skip_or_fail "chromium is not installed and apt-get could not install it"
  fi
fi
chrome() {  # chrome ARGS... : headless, no network services, a fresh profile each time
  local profile
  profile=$(mktemp -d "$WORK/profile.XXXX")
  timeout 120 chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --disable-quic --user-data-dir="$profile" "$@" 2>> chrome.err
}

TINY=(--set model.hidden_size=32 --set model.num_hidden_layers=1 --set model.num_attention_heads=2
      --set model.num_key_value_heads=1 --set model.head_dim=16 --set model.intermediate_size=64
      --set warmstart.steps=5 --set rl.steps=8 --set rl.groups_per_step=4 --set task.eval_size=30 --set eval.every=3
      --set rollout.transport=threads --set rollout.actors=2 --set rollout.slow_actors=1 --set rollout.slowdown=2)
CONFIG=$(dirname "$ECHELON")/../configs/math-tiny.yaml
[ -f "$CONFIG" ] || CONFIG=$(realpath "$(dirname "$0")/../configs/math-tiny.yaml")

# S=0 with actor threads (no broadcast); S=2 with actor processes, whose snapshots go by the
# peer-assisted broadcast, so the broadcast-time chart has data.
for s in 0 2; do
  transport=threads
  [ "$s" -eq 2 ] && transport=processes
  timeout 300 "$ECHELON" train "$CONFIG" --out "S$s" "${TINY[@]}" --set rl.staleness=$s \
    --set rollout.transport=$transport > "train$s.out" 2> "train$s.err"
  check "train S=$s exits 0" test $? -eq 0
done
"$ECHELON" report S0 S2 --out report.html > report.out 2> report.err
check "report exits 0" test $? -eq 0
check "report says what it wrote" contains report.out "wrote report.html (2 runs)"
check "report is non-trivial" test "$(stat -c %s report.html 2>/dev/null || echo 0)" -gt 10000
check "each run's workers in the worker statistics table" \
  test "$(grep -o '<tr><td>S[02]</td><td>[^<]*</td><td class="num">[1-9]' report.html | wc -l)" -ge 3

# Bad input: one clear line naming what is wrong.
"$ECHELON" report S0 nowhere --out bad.html > /dev/null 2> missing.err
check "missing dir exits 2" test $? -eq 2
check "missing dir is named" contains missing.err "nowhere: no such run directory"
check "nothing written on error" test ! -e bad.html
cp -r S0 broken
printf '{"step": 99, "wall_s": oops}\n' >> broken/metrics.jsonl
line=$(wc -l < broken/metrics.jsonl)
"$ECHELON" report broken --out bad.html > /dev/null 2> malformed.err
check "malformed line exits 2" test $? -eq 2
check "malformed line names file:line" contains malformed.err "broken/metrics.jsonl:$line: not a JSON object"

# The rendered DOM: every chart has finite data marks.
chrome --dump-dom "file://$WORK/report.html" > dom.html
check "chromium dumps the DOM" test -s dom.html
python3 - dom.html > dom_check.out 2>&1 <<'EOF'
import math, re, sys
from html.parser import HTMLParser

class Charts(HTMLParser):
    def __init__(self):
        super().__init__()
        self.charts, self.cur, self.depth = [], None, 0
    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "svg" and "chart" in (a.get("class") or "").split():
            self.cur = {"title": None, "marks": [], "bad": []}
            self.charts.append(self.cur)
            self.depth = 0
        if self.cur is None:
            return
        if tag == "svg":
            self.depth += 1
        if "data" in (a.get("class") or "").split():
            if tag == "polyline":
                nums = re.split(r"[ ,]+", a.get("points", "").strip())
            elif tag == "circle":
                nums = [a.get("cx", ""), a.get("cy", "")]
            elif tag == "rect":
                nums = [a.get(k, "") for k in ("x", "y", "width", "height")]
            else:
                nums = []
            try:
                vals = [float(n) for n in nums]
            except ValueError:
                vals = [math.nan]
            if not vals or not all(math.isfinite(v) for v in vals):
                self.cur["bad"].append(tag)
            else:
                self.cur["marks"].append(tag)
    def handle_endtag(self, tag):
        if self.cur is not None and tag == "svg":
            self.depth -= 1
            if self.depth == 0:
                self.cur = None
    def handle_data(self, data):
        if self.cur is not None and self.cur["title"] is None and data.strip():
            self.cur["title"] = data.strip()

p = Charts()
p.feed(open(sys.argv[1]).read())
ok = len(p.charts) >= 10
print("charts:", len(p.charts))
for c in p.charts:
    print("%-70s marks=%d bad=%d" % (c["title"], len(c["marks"]), len(c["bad"])))
    ok = ok and len(c["marks"]) > 0 and not c["bad"]
dom = open(sys.argv[1]).read()
ok = ok and "NaN" not in dom and "nan," not in dom
sys.exit(0 if ok else 1)
EOF
check "every chart has finite data marks (dom_check.out)" test $? -eq 0
check "the broadcast-time chart is drawn (S=2 broadcast its snapshots)" grep -q '^Snapshot broadcast time.*marks=[1-9]' dom_check.out
check "both runs in the legends" test "$(grep -o '>S2</text>' dom.html | wc -l)" -ge 9

# The screenshot is not blank: many colours, and the first two series colours are drawn.
chrome --window-size=1300,2600 --screenshot="$WORK/shot.png" "file://$WORK/report.html" > /dev/null
check "chromium writes a screenshot" test -s shot.png
python3 - shot.png > shot_check.out 2>&1 <<'EOF'
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat, w = 8, b"", 0
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype = struct.unpack(">IIBB", body[:10])
        assert depth == 8 and ctype in (2, 6), "unexpected PNG format %d/%d" % (depth, ctype)
        bpp = 3 if ctype == 2 else 4
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
raw = zlib.decompress(idat)
stride = w * bpp
prev = bytearray(stride)
colours = {}
for y in range(h):
    f = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    prev = line
    for x in range(0, stride, bpp):
        k = bytes(line[x:x + 3])
        colours[k] = colours.get(k, 0) + 1
total = w * h
top = max(colours.values())
series = [bytes.fromhex("4e79a7"), bytes.fromhex("f28e2b")]
print("size %dx%d, distinct colours %d, most common covers %.1f%%, series pixels %s"
      % (w, h, len(colours), 100.0 * top / total, [colours.get(s, 0) for s in series]))
ok = len(colours) >= 50 and top < 0.97 * total and all(colours.get(s, 0) >= 100 for s in series)
sys.exit(0 if ok else 1)
EOF
check "screenshot is not blank (shot_check.out)" test $? -eq 0
cat dom_check.out shot_check.out
if [ -n "${REPORT_TEST_KEEP:-}" ]; then
  mkdir -p "$REPORT_TEST_KEEP" && cp report.html dom.html shot.png dom_check.out shot_check.out "$REPORT_TEST_KEEP"/
fi

echo "$pass passed, $fails failed"
[ "$fails" -eq 0 ]
