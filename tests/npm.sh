# npm_install_or_skip DIR PURPOSE PACKAGE@VERSION...   (sourced, not run)
# Installs the pinned npm packages into DIR/node_modules unless each is there already (never
# into the source tree). When Node or npm is missing or npm cannot install (offline), the test
# exits 77 (CTest "skipped") saying why, or fails under CI=true: a check against an independent
# reference that cannot run is not a pass. PURPOSE completes "node and npm are needed to ...".
# One DIR serves one package list: `npm install --no-save` prunes every package it was not
# given, so a second test installing another list into the same DIR would delete the first
# test's packages while it runs. DIR/.packages records the list; another list is refused.

source "$(dirname "${BASH_SOURCE[0]}")/skip.sh"

npm_install_or_skip() {
  local dir=$1 purpose=$2
  shift 2
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    skip_or_fail "node and npm are needed to $purpose"
  fi
  mkdir -p "$dir"
  local wanted="$*" lock
  exec {lock}>"$dir/.lock"
  flock "$lock"
  if [ -f "$dir/.packages" ] && [ "$(cat "$dir/.packages")" != "$wanted" ]; then
    echo "FAIL: $dir holds npm packages for another test ($(cat "$dir/.packages")), not $wanted;" \
         "give this test its own directory" >&2
    exit 1
  fi
  echo "$wanted" > "$dir/.packages"
  local pkg missing=0
  for pkg in "$@"; do
    [ -f "$dir/node_modules/${pkg%@*}/package.json" ] || missing=1
  done
  if [ "$missing" -ne 0 ] &&
     ! (cd "$dir" && timeout 300 npm install --no-save --no-audit --no-fund --loglevel=error "$@"); then
    skip_or_fail "npm could not install $* (offline?)"
  fi
  exec {lock}>&-
}
