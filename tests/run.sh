#!/usr/bin/env bash
# Runs every test of the project. Installs what the tests need (idempotently): python-qpid-proton,
# the KubeMQ SDK and kubernetes-validate from PyPI, rhea and rhea-promise from npm. Rust's own
# tools come with cargo.
set -euo pipefail
export CARGO_TERM_COLOR=never
cd "$(dirname "$0")/.."

if ! python3 -c 'import proton' 2>/dev/null; then
  echo "== installing python-qpid-proton"
  python3 -m pip install --quiet --disable-pip-version-check 'python-qpid-proton==0.40.0'
fi
if ! python3 -c 'import kubemq' 2>/dev/null; then
  echo "== installing the KubeMQ Python SDK"
  python3 -m pip install --quiet --disable-pip-version-check 'kubemq==4.1.5'
fi
if ! command -v kubernetes-validate >/dev/null || ! python3 -c 'import jsonschema, yaml' 2>/dev/null; then
  echo "== installing kubernetes-validate (Kubernetes JSON schemas; brings jsonschema and PyYAML)"
  python3 -m pip install --quiet --disable-pip-version-check 'kubernetes-validate==1.37.0'
fi
if [ ! -d tests/js/node_modules/rhea-promise ] || [ ! -d tests/js/node_modules/rhea ]; then
  echo "== installing rhea and rhea-promise"
  (cd tests/js && npm ci --no-audit --no-fund --silent)
fi

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
echo "== cargo test"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace 2>&1 | tee "$log"
# One closing line with the totals of every test binary (the last binary run is often the empty
# doc-test pass, which would otherwise be the closing line).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed;?$/) p += $i; if ($(i+1) ~ /^failed;?$/) f += $i } }
     END { printf "total: %d passed, %d failed\n", p, f; if (p == 0) exit 1 }' "$log"
