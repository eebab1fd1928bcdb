#!/usr/bin/env bash
# Runs every test of the project. Installs what the interop tests need (idempotently):
# python-qpid-proton from PyPI, rhea and rhea-promise from npm. Rust's own tools come with cargo.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -c 'import proton' 2>/dev/null; then
  echo "== installing python-qpid-proton"
  python3 -m pip install --quiet --disable-pip-version-check 'python-qpid-proton==0.40.0'
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
cargo test --workspace
