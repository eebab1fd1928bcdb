#!/usr/bin/env bash
# Builds promtool (Prometheus's own rule checker) and Prometheus itself, without its service
# discovery plugins (the suite scrapes static targets), from their Go module at the version
# go.mod names, with this machine's Go. Cached by the hash of go.mod and go.sum, so a second
# run builds nothing. Prints the folder holding both binaries.
set -euo pipefail
cd "$(dirname "$0")"
TOOLS="${KUBEMQ_AMQP_TOOLS:-$HOME/.cache/kubemq-amqp-tools}"
KEY=$(cat go.mod go.sum | sha256sum | cut -c1-12)
OUT="$TOOLS/prometheus-$KEY"
if [ ! -x "$OUT/promtool" ] || [ ! -x "$OUT/prometheus" ]; then
  echo "== building promtool and prometheus (once; cached in $OUT)" >&2
  rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp"
  go build -mod=readonly -trimpath -ldflags "-s -w" -o "$OUT.tmp/promtool" \
    github.com/prometheus/prometheus/cmd/promtool
  go build -mod=readonly -trimpath -tags remove_all_sd -ldflags "-s -w" -o "$OUT.tmp/prometheus" \
    github.com/prometheus/prometheus/cmd/prometheus
  rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
fi
echo "$OUT"
