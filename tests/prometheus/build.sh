#!/usr/bin/env bash
# Builds promtool, Prometheus's own rule checker, from its Go module (the version go.mod names),
# with this machine's Go. Cached by the hash of go.mod and go.sum, so a second run builds
# nothing. Prints the path of the binary.
set -euo pipefail
cd "$(dirname "$0")"
TOOLS="${KUBEMQ_AMQP_TOOLS:-$HOME/.cache/kubemq-amqp-tools}"
KEY=$(cat go.mod go.sum | sha256sum | cut -c1-12)
OUT="$TOOLS/promtool-$KEY"
if [ ! -x "$OUT/promtool" ]; then
  echo "== building promtool (once; cached in $OUT)" >&2
  rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp"
  go build -mod=readonly -trimpath -ldflags "-s -w" -o "$OUT.tmp/promtool" \
    github.com/prometheus/prometheus/cmd/promtool
  rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
fi
echo "$OUT/promtool"
