# Sourced by the benchmarks that compare against the PyTorch-eager reference: checks that
# $REF (default ../shared/tools/ref_qwen3.py) exists and installs Debian's python3-torch and
# python3-numpy when missing (root).
REF=${REF:-../shared/tools/ref_qwen3.py}
[ -f "$REF" ] || { echo "reference not found: $REF (set REF=...)" >&2; exit 1; }
for p in python3-torch python3-numpy; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || \
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$p" >/dev/null; }
done
