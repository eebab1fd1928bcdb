#!/usr/bin/env bash
# What span export costs the connector: two connectors on their embedded stores, one exporting
# spans over OTLP/gRPC to a real Jaeger (tests/jaeger/build.sh builds it from its Go module), one
# without OTEL_EXPORTER_OTLP_ENDPOINT. The same load (fe2o3 client, 2 producers + 2 consumers)
# runs through each, with messages that carry no trace context and with messages that each carry
# a traceparent of their own (the exporting one records four spans per message), in turn, ROUNDS
# times. Prints each run's throughput, the connector's and Jaeger's CPU per message, and the
# spans Jaeger accepted per message (its own count). The exporting connector's span queue is
# made large enough to hold a run's spans (OTEL_BSP_MAX_QUEUE_SIZE; by default it keeps 2,048
# and drops the rest), so every span is exported and paid for. Not part of CI. Loopback only;
# ports 5686, 5687, 14317, 16696-16697, 18888.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-50000}
ROUNDS=${ROUNDS:-3}
CLK=$(getconf CLK_TCK)
B=./target/release
cargo build --release --quiet -p kubemq-amqp-connector -p amqp-bench
JAEGER_BIN=$(bash tests/jaeger/build.sh)

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
OFF=
ON=
JAEGER=
DATA=$(mktemp -d)
trap 'for p in $OFF $ON $JAEGER; do kill $p 2>/dev/null; done; wait 2>/dev/null; rm -rf "$DATA"' EXIT

JAEGER_OTLP=127.0.0.1:14317 JAEGER_QUERY=127.0.0.1:16696 JAEGER_QUERY_GRPC=127.0.0.1:16697 \
  JAEGER_METRICS_PORT=18888 "$JAEGER_BIN" --config=tests/jaeger/config.yaml >"$DATA/jaeger.log" 2>&1 &
JAEGER=$!
mkdir -p "$DATA/off" "$DATA/on"
$B/kubemq-amqp-connector --data-dir "$DATA/off" --port 5686 --http-address off >/dev/null 2>&1 &
OFF=$!
OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:14317 OTEL_BSP_MAX_QUEUE_SIZE=1000000 \
  OTEL_BSP_MAX_EXPORT_BATCH_SIZE=2048 OTEL_BSP_SCHEDULE_DELAY=200 \
  $B/kubemq-amqp-connector --data-dir "$DATA/on" --port 5687 --http-address off >"$DATA/on.log" 2>&1 &
ON=$!
sleep 2
grep -q "exporting spans" "$DATA/on.log" || { echo "the exporting connector did not start export:"; cat "$DATA/on.log"; exit 1; }

# Spans Jaeger's OTLP receiver accepted so far.
accepted() { curl -s http://127.0.0.1:18888/metrics | awk '/^otelcol_receiver_accepted_spans/ {s += $NF} END {printf "%d", s}'; }

# usage: bench LABEL PORT [amqp-bench args]; prints throughput, CPU µs and spans per message
bench() {
  local label=$1 port=$2 pid; shift 2
  pid=$([ "$port" = 5686 ] && echo "$OFF" || echo "$ON")
  local c0 j0 s0 out
  c0=$(cpu_ticks "$pid"); j0=$(cpu_ticks "$JAEGER"); s0=$(accepted)
  out=$($B/amqp-bench --url "amqp://127.0.0.1:$port" --messages "$N" --producers 2 --consumers 2 "$@" 2>&1)
  # The last spans are exported within the schedule delay, and Jaeger's CPU counts them too.
  sleep 2
  local c1 j1 s1 rate
  c1=$(cpu_ticks "$pid"); j1=$(cpu_ticks "$JAEGER"); s1=$(accepted)
  rate=$(sed -n 's/.* = \([0-9]*\) msg\/s/\1/p' <<<"$out")
  per() { awk -v a="$1" -v b="$2" -v n="$N" -v c="$CLK" 'BEGIN {printf "%.1f", (b - a) / c * 1e6 / n}'; }
  local spans
  spans=$(awk -v a="$s0" -v b="$s1" -v n="$N" 'BEGIN {printf "%.2f", (b - a) / n}')
  local line="$label: $rate msg/s; connector $(per "$c0" "$c1") µs/msg, Jaeger $(per "$j0" "$j1") µs/msg; $spans spans/msg"
  grep -q "^lost 0 duplicated 0" <<<"$out" || line+=" (LOSS: $(grep '^lost' <<<"$out"))"
  echo "$line"
}

for r in $(seq "$ROUNDS"); do
  bench "round $r export off, untraced" 5686 --address "queues/off-plain-$r"
  bench "round $r export on,  untraced" 5687 --address "queues/on-plain-$r"
  bench "round $r export off, traced  " 5686 --traceparent --address "queues/off-traced-$r"
  bench "round $r export on,  traced  " 5687 --traceparent --address "queues/on-traced-$r"
done
