#!/usr/bin/env bash
# Installs the Debian 12 packages echelon builds and runs with. Idempotent: packages already
# present are skipped, so a second run costs one dpkg query.
set -euo pipefail

PACKAGES=(
  build-essential cmake ccache pkg-config
  libtorch-dev libopenblas0-pthread libgloo-dev
  libyaml-cpp-dev libcli11-dev libspdlog-dev nlohmann-json3-dev libssl-dev libzstd-dev zlib1g-dev
  libgrpc++-dev libprotobuf-dev protobuf-compiler protobuf-compiler-grpc libcpp-httplib-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  libicu-dev
  libjemalloc-dev
  python3 python3-jinja2 jq iproute2 curl
  nftables  # a NAT-like firewall in a network namespace (tests/broadcast_nat_test.sh)
  prometheus  # promtool checks the /metrics exposition (tests/serve_api_test.sh, tests/prometheus_test.sh)
  dpkg-dev debootstrap python3-yaml
)

# ECHELON_SKIP_LIBTORCH=1: a GPU machine builds against its PyTorch's LibTorch
# (scripts/gpu-check.sh), not Debian's CPU one.
if [ "${ECHELON_SKIP_LIBTORCH:-0}" = 1 ]; then
  PACKAGES=("${PACKAGES[@]/libtorch-dev/}")
fi

missing=()
for p in "${PACKAGES[@]}"; do
  [ -n "$p" ] || continue
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing packages: ${missing[*]}; run as root (or: sudo $0)" >&2
  exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
