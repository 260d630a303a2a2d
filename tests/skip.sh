# skip_or_fail REASON   (sourced, not run)
# Ends a test whose independent reference cannot run here (a package, a browser, network
# namespaces): exit 77 (CTest "skipped") with the reason, or a failure under CI=true, where a
# check that did not run is not a pass.
skip_or_fail() {
  if [ "${CI:-}" = true ]; then
    echo "FAIL: $1 (CI=true: a reference check may not be skipped)"
    exit 1
  fi
  echo "SKIPPED: $1"
  exit 77
}
