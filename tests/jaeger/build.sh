#!/usr/bin/env bash
# Builds Jaeger (its v2 binary, an OpenTelemetry Collector with Jaeger's in-memory storage and
# query API) from its Go module at the version go.mod names, with this machine's Go: the OTLP
# receiver the suite's trace test sends spans to and reads them back from. Cached by the hash of
# go.mod and go.sum, so a second run builds nothing. Prints the binary's path.
set -euo pipefail
cd "$(dirname "$0")"
TOOLS="${KUBEMQ_AMQP_TOOLS:-$HOME/.cache/kubemq-amqp-tools}"
KEY=$(cat go.mod go.sum | sha256sum | cut -c1-12)
OUT="$TOOLS/jaeger-$KEY"
if [ ! -x "$OUT/jaeger" ]; then
  echo "== building jaeger (once; cached in $OUT)" >&2
  rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp"
  go build -mod=readonly -trimpath -ldflags "-s -w" -o "$OUT.tmp/jaeger" \
    github.com/jaegertracing/jaeger/cmd/jaeger
  rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
fi
echo "$OUT/jaeger"
