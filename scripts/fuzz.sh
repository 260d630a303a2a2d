#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) in build-fuzz/ and runs each for
# FUZZ_SECONDS (default 60) over its corpus in fuzz/corpus/<target>/. New inputs that grow
# coverage are kept in build-fuzz/corpus/<target>/ (not in the repository).
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_EACH=${FUZZ_SECONDS:-60}
bash scripts/install-deps.sh
command -v clang++ >/dev/null || { apt-get update -qq && apt-get install -y -qq clang libclang-rt-14-dev >/dev/null; }
export CCACHE_BASEDIR=$PWD
cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ -DECHELON_FUZZ=ON >/dev/null
targets=(submit safetensors config_yaml math_jsonl parquet safe_regex)
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]/%/_fuzz}"
for t in "${targets[@]}"; do
  mkdir -p "build-fuzz/corpus/$t"
  echo "fuzzing $t for ${SECONDS_EACH}s"
  "build-fuzz/${t}_fuzz" -max_total_time="$SECONDS_EACH" -max_len=65536 -rss_limit_mb=4096 \
    "build-fuzz/corpus/$t" "fuzz/corpus/$t" 2>&1 | tail -n 3
done
echo "fuzzing done: no crashes"
