#!/usr/bin/env bash
# System test of the Debian package: builds it with CPack, installs it with apt into a clean
# Debian 12 root (debootstrap --variant=minbase, from the mirror this machine's apt uses), so
# that apt must pull every dependency the package declares, then runs the installed binary
# there: `echelon --version`, a short `echelon train` of the installed default config from
# /tmp, and `echelon plan` of an installed plan config.
#
# Reruns are cheap: the bootstrapped root is kept as BUILD_DIR/package-test/bookworm-minbase.tar
# (rebuilt when older than 7 days) and apt's downloaded packages in package-test/apt-archives/;
# every run still starts from an unpacked copy of the bare root. Delete package-test/ for a run
# from nothing.
#
# Needs root (chroot, mounts), debootstrap and dpkg-dev (scripts/install-deps.sh) and the
# mirror; without them the test is skipped, or fails under CI=true. Measured on 2 cores: about
# 70-160 s from nothing (debootstrap 35-100 s, apt 25-40 s), about 45 s with the cache; every
# step has a time limit, together below the ctest TIMEOUT.
# Usage: tests/package_test.sh path/to/echelon BUILD_DIR
set -uo pipefail
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/skip.sh"
ECHELON=$(realpath "$1")
BUILD=$(realpath "$2")
SUITE=bookworm
CACHE=$BUILD/package-test
T0=$SECONDS

[ "$(id -u)" -eq 0 ] || skip_or_fail "the package test needs root (debootstrap, chroot, mounts)"
for tool in cpack dpkg-deb dpkg-shlibdeps debootstrap chroot mount umount findmnt flock tar jq; do
  command -v "$tool" > /dev/null || skip_or_fail "the package test needs $tool (scripts/install-deps.sh)"
done
[ -f "$BUILD/CPackConfig.cmake" ] || { echo "FAIL: $BUILD/CPackConfig.cmake missing (not a configured build dir)"; exit 1; }

# The mirrors this machine's apt uses (deb822 .sources or one-line .list), else deb.debian.org.
apt_uris() {
  cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
    sed -n -e 's/^URIs:[[:space:]]*//p' -e 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]\+\).*/\2/p' |
    tr ' ' '\n' | grep -v '^$'
}
MIRROR=$(apt_uris | grep -E '/debian/?$' | head -n1)
SECURITY=$(apt_uris | grep -E '/debian-security/?$' | head -n1)
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY=${SECURITY:-http://deb.debian.org/debian-security}

mkdir -p "$CACHE/apt-archives/partial"
exec 9> "$CACHE/lock"
flock 9  # one run per build directory at a time

# Ends the processes running in a root under $1, unmounts everything under $1 (deepest first)
# and removes $1 only when nothing is mounted there any more: a root with /dev bound into it
# must never meet rm -rf.
mounts_under() { findmnt -rn -o TARGET | grep -E "^$1(/|$)" | sort -r; }
teardown() {
  local dir=$1 m p
  [ -d "$dir" ] || return 0
  for p in /proc/[0-9]*; do  # a timed-out run's learner and actors
    case "$(readlink "$p/root" 2>/dev/null)" in "$dir"/*) kill -9 "${p#/proc/}" 2>/dev/null ;; esac
  done
  for m in $(mounts_under "$dir"); do umount "$m" 2>/dev/null || umount -l "$m"; done
  if [ -n "$(mounts_under "$dir")" ]; then
    echo "WARNING: still mounted under $dir; left in place" >&2
    return 1
  fi
  rm -rf --one-file-system "$dir"
}
# A run killed without its trap (ctest's timeout) leaves its root behind: reap it now.
for stale in "$CACHE"/run.*; do [ -d "$stale" ] && teardown "$stale"; done

WORK=$(mktemp -d "$CACHE/run.XXXXXX")
ROOT=$WORK/root
trap 'teardown "$WORK"; echo "package test: $((SECONDS - T0)) s with the clean-up"' EXIT
trap 'exit 130' INT TERM
in_root() { chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 \
  DEBIAN_FRONTEND=noninteractive "$@" 9>&-; }  # the lock stays with this script
phase() { printf 'package test: %-28s %4d s\n' "$1" $((SECONDS - $2)); }

# 1. The package.
t=$SECONDS
if ! timeout 300 cpack -G DEB --config "$BUILD/CPackConfig.cmake" -B "$WORK/deb" > "$WORK/cpack.log" 2>&1 9>&-; then
  cat "$WORK/cpack.log"
  echo "FAIL: cpack -G DEB"
  exit 1
fi
DEB=$(ls "$WORK"/deb/echelon_*.deb 2>/dev/null | head -n1)
check "cpack wrote echelon_<version>_<arch>.deb" test -s "$DEB"
[ -s "$DEB" ] || { finish; exit 1; }
phase "cpack" "$t"
VERSION=$(sed -n 's/^set(CPACK_PACKAGE_VERSION "\(.*\)")$/\1/p' "$BUILD/CPackConfig.cmake")
depends=$(dpkg-deb -f "$DEB" Depends)
echo "Depends: $depends"
check "package version is the project's ($VERSION)" test "$(dpkg-deb -f "$DEB" Version)" = "$VERSION"
depends_has() { grep -Eq -- "$1" <<< "$depends"; }
from_shlibdeps() { depends_has 'libtorch' && depends_has '(^|, )libc6 '; }
no_dev_package() { ! depends_has '-dev( |,|$)'; }
check "Depends computed by dpkg-shlibdeps (libtorch, libc6)" from_shlibdeps
check "Depends names libopenblas0-pthread" depends_has '(^|, )libopenblas0-pthread(,|$)'
check "Depends names no -dev package" no_dev_package
for f in Maintainer Description Section; do
  check "package has a $f field" test -n "$(dpkg-deb -f "$DEB" "$f")"
done
dpkg-deb -c "$DEB" | awk '{print $6}' > "$WORK/contents"
for f in ./usr/bin/echelon ./usr/share/echelon/configs/math-tiny.yaml ./usr/share/echelon/data/prices.yaml \
         ./usr/share/doc/echelon/README.md ./usr/share/doc/echelon/DEPLOY.md ./usr/share/doc/echelon/deploy/k8s/learner.yaml \
         ./usr/share/doc/echelon/LICENSE ./usr/share/doc/echelon/NOTICE ./usr/share/doc/echelon/copyright; do
  check "package holds $f" grep -qx -- "$f" "$WORK/contents"
done

# 2. A clean Debian 12 root.
t=$SECONDS
BASE=$CACHE/$SUITE-minbase.tar
fresh=cached
if [ ! -s "$BASE" ] || [ -n "$(find "$BASE" -mtime +7)" ]; then
  fresh=fresh
  mkdir -p "$WORK/base"
  if ! timeout 600 debootstrap --variant=minbase "$SUITE" "$WORK/base" "$MIRROR" > "$WORK/debootstrap.log" 2>&1 9>&-; then
    tail -n 20 "$WORK/debootstrap.log"
    teardown "$WORK/base" > /dev/null 2>&1 || true
    skip_or_fail "debootstrap could not build a $SUITE root from $MIRROR (offline?)"
  fi
  for m in $(mounts_under "$WORK/base"); do umount "$m" 2>/dev/null || umount -l "$m"; done
  [ -z "$(mounts_under "$WORK/base")" ] || { echo "FAIL: debootstrap left mounts under $WORK/base"; exit 1; }
  rm -f "$WORK/base/var/cache/apt/archives/"*.deb
  tar -C "$WORK/base" --one-file-system --numeric-owner -cf "$BASE.tmp" . && mv "$BASE.tmp" "$BASE"
  teardown "$WORK/base"
fi
mkdir -p "$ROOT"
# The installed root is ~1.4 GB: in memory when there is room (unpacking and removing it on disk
# costs about a minute more), else on disk beside the cache.
if [ "$(awk '/^MemAvailable:/ {print int($2 / 1048576)}' /proc/meminfo)" -ge 8 ]; then
  mount -t tmpfs -o size=4g,mode=755 tmpfs "$ROOT" || skip_or_fail "cannot mount a tmpfs (a container without CAP_SYS_ADMIN?)"
fi
tar -C "$ROOT" --numeric-owner -xpf "$BASE"
phase "$SUITE root ($fresh)" "$t"

cat > "$ROOT/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY $SUITE-security main
EOF
cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null
printf '#!/bin/sh\nexit 101\n' > "$ROOT/usr/sbin/policy-rc.d" && chmod +x "$ROOT/usr/sbin/policy-rc.d"
if ! { mount -t proc proc "$ROOT/proc" && mount -t sysfs -o ro sysfs "$ROOT/sys" && mount --bind /dev "$ROOT/dev" &&
       mount --bind "$CACHE/apt-archives" "$ROOT/var/cache/apt/archives"; }; then
  skip_or_fail "cannot mount /proc, /sys and /dev into a chroot here (a container without CAP_SYS_ADMIN?)"
fi

# 3. apt installs the package and what its Depends name.
t=$SECONDS
APT=(apt-get -q -y -o APT::Sandbox::User=root -o Dpkg::Use-Pty=0 -o Dpkg::Options::=--force-unsafe-io)
cp "$DEB" "$ROOT/tmp/"
if ! in_root timeout 300 "${APT[@]}" update > "$WORK/apt.log" 2>&1; then
  tail -n 20 "$WORK/apt.log"
  skip_or_fail "apt-get update inside the root failed (mirror $MIRROR unreachable?)"
fi
in_root timeout 600 "${APT[@]}" install --no-install-recommends "/tmp/$(basename "$DEB")" >> "$WORK/apt.log" 2>&1
rc=$?
check "apt installs the package with its dependencies" test "$rc" -eq 0
[ "$rc" -eq 0 ] || { tail -n 40 "$WORK/apt.log"; finish; exit 1; }
phase "apt-get install" "$t"
echo "package test: $(grep -c '^Setting up' "$WORK/apt.log") packages set up, $(du -smx "$ROOT" | cut -f1) MB root"
check "no library is missing" sh -c "! chroot '$ROOT' ldd /usr/bin/echelon | grep -q 'not found'"
check "libblas.so.3 is OpenBLAS" sh -c "chroot '$ROOT' sh -c 'readlink -f /usr/lib/*/libblas.so.3' | grep -q openblas"
check "no compiler came with it" sh -c "! chroot '$ROOT' sh -c 'command -v c++ || command -v cc || command -v g++'"

# 4. The installed binary, from a directory that is not the source tree.
t=$SECONDS
in_root sh -c 'cd /tmp && timeout 30 echelon --version' > "$WORK/version.out" 2>&1
check "echelon --version exits 0" test $? -eq 0
cat "$WORK/version.out"
check "echelon --version names $VERSION" grep -q -- "$VERSION" "$WORK/version.out"

# The default job, shrunk the way tests/cli_test.sh shrinks it: a tiny model, 3 updates.
TINY="--set model.hidden_size=32 --set model.num_hidden_layers=1 --set model.num_attention_heads=2
      --set model.num_key_value_heads=1 --set model.head_dim=16 --set model.intermediate_size=64
      --set warmstart.steps=5 --set rl.steps=3 --set rl.groups_per_step=4 --set task.eval_size=30 --set eval.every=2"
in_root sh -c "cd /tmp && timeout 300 echelon train /usr/share/echelon/configs/math-tiny.yaml --out run $(echo $TINY)" \
  > "$WORK/train.out" 2> "$WORK/train.err"
rc=$?
check "installed echelon train exits 0" test "$rc" -eq 0
[ "$rc" -eq 0 ] || tail -n 20 "$WORK/train.err"
check "3 updates, one progress line each" test "$(grep -c '^step ' "$WORK/train.out")" -eq 3
summary_done() { tail -n1 "$WORK/train.out" | jq -e '.steps == 3 and .interrupted == false' > /dev/null; }
check "summary says 3 steps, not interrupted" summary_done
for f in config.yaml metrics.jsonl checkpoints/warmstart/model.safetensors checkpoints/final/model.safetensors; do
  check "run has $f" test -s "$ROOT/tmp/run/$f"
done
phase "echelon train (3 updates)" "$t"

# A plan config names ../data/prices.yaml: resolved against the installed config's directory.
in_root sh -c 'cd /tmp && timeout 60 echelon plan /usr/share/echelon/configs/plan-qwen3-4b.yaml' > "$WORK/plan.out" 2>&1
rc=$?
check "installed echelon plan exits 0" test "$rc" -eq 0
[ "$rc" -eq 0 ] || tail -n 5 "$WORK/plan.out"

in_root timeout 120 "${APT[@]}" purge echelon > "$WORK/purge.log" 2>&1
check "apt purges the package" test $? -eq 0
check "purge leaves no echelon files" test ! -e "$ROOT/usr/bin/echelon" -a ! -e "$ROOT/usr/share/echelon"

echo "package test: total $((SECONDS - T0)) s ($fresh root)"
finish
