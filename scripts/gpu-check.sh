#!/usr/bin/env bash
# GPU check, for a machine with an NVIDIA GPU and a PyTorch installation with CUDA:
# builds echelon against the LibTorch inside that PyTorch (torch.utils.cmake_prefix_path),
# then runs bench/gpu_check_bench.cc on cuda (bf16 logits against fp32 CPU, one learner update,
# generation tokens/s), the learner's unit tests (with the CUDA build), and a two-rank learner
# update when two GPUs exist (over NCCL where the PyTorch has it and nccl.h is found, else Gloo,
# whose gradients pass through host memory).
#
# What a PyTorch install does not bring, and how it comes: gRPC, protobuf, yaml-cpp, CLI11,
# spdlog, nlohmann-json, OpenSSL, cpp-httplib, ICU, GoogleTest, Google Benchmark, jemalloc from
# the OS packages (scripts/install-deps.sh with ECHELON_SKIP_LIBTORCH=1, so Debian's CPU
# LibTorch is not installed beside PyTorch's; libgloo-dev's headers stay, for c10d).
# Usage: scripts/gpu-check.sh [PYTHON]     (default python3; run as root to install packages)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
command -v nvidia-smi >/dev/null || { echo "gpu-check: no nvidia-smi: this machine has no NVIDIA driver" >&2; exit 1; }
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
"$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" ||
  { echo "gpu-check: $PY's torch has no CUDA (torch.cuda.is_available() is False)" >&2; exit 1; }
PREFIX=$("$PY" -c "import torch; print(torch.utils.cmake_prefix_path)")
echo "LibTorch from $PREFIX ($("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda)'))"
ECHELON_SKIP_LIBTORCH=1 bash scripts/install-deps.sh
# NCCL for CUDA ranks where this PyTorch has it; nccl.h from its nvidia-nccl wheel or the system.
NCCL_FLAGS=()
if "$PY" -c "import torch.distributed as d, sys; sys.exit(0 if d.is_nccl_available() else 1)"; then
  NCCL_INC=$("$PY" -c "import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], 'include'))" 2>/dev/null || true)
  [ -f "$NCCL_INC/nccl.h" ] || NCCL_INC=/usr/include
  if [ -f "$NCCL_INC/nccl.h" ]; then
    NCCL_FLAGS=(-DECHELON_NCCL=ON -DNCCL_INCLUDE_DIR="$NCCL_INC")
    echo "NCCL: nccl.h in $NCCL_INC"
  else
    echo "NCCL: this PyTorch has it but no nccl.h was found (pip nvidia-nccl-cu12 or libnccl-dev brings it): ranks reduce over Gloo"
  fi
else
  echo "NCCL: not in this PyTorch: ranks reduce over Gloo"
fi
BUILD=build-gpu
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX" "${NCCL_FLAGS[@]}" >/dev/null
cmake --build "$BUILD" -j "$(nproc)" --target echelon echelon_tests gpu_check_bench learner_update_bench
"$BUILD/gpu_check_bench" cuda
"$BUILD/echelon_tests" --gtest_filter='Learner*:Qwen3*:Generate*' --gtest_brief=1
GPUS=$(nvidia-smi --list-gpus | wc -l)
if [ "$GPUS" -ge 2 ]; then
  PORT=$((29700 + RANDOM % 200))
  WORLD_SIZE=2 RANK=1 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT "$BUILD/learner_update_bench" --micro 1024 \
    --device cuda:1 &
  WORLD_SIZE=2 RANK=0 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT "$BUILD/learner_update_bench" --micro 1024 \
    --device cuda:0
  wait
else
  echo "one GPU: the two-rank check needs two"
fi
