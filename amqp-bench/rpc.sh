#!/usr/bin/env bash
# Request/reply through the connector (embedded store): round-trip latency at 1,000 requests/s,
# round trips per second with 64 in flight, and the connector's CPU per round trip; then the same
# loads straight on KubeMQ's gRPC API (SendRequest / SubscribeToRequests / SendResponse) served by
# a second connector process's store façade, for what AMQP adds. 1 KiB requests and replies
# (queries echo the request). Prints markdown tables. Not part of CI.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-50000}
PORT=5686
GRPC=50096
CLK=$(getconf CLK_TCK)
cargo build --release --quiet -p kubemq-amqp-connector -p amqp-bench

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
PIDS=()
DATA=$(mktemp -d)
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$DATA"' EXIT
./target/release/kubemq-amqp-connector --port $PORT --bind-address 127.0.0.1 --data-dir "$DATA/amqp" \
  --http-address off >/dev/null 2>&1 &
CONN=$!
PIDS+=("$CONN")
./target/release/kubemq-amqp-connector --port 5687 --bind-address 127.0.0.1 --data-dir "$DATA/grpc" \
  --http-address off --serve-kubemq-grpc "127.0.0.1:$GRPC" >/dev/null 2>&1 &
FACADE=$!
PIDS+=("$FACADE")
sleep 1

# row NAME PID COUNT ARGS...: one line of the table, with the server process's CPU per round trip.
row() {
  local name=$1 pid=$2 n=$3
  shift 3
  local t0 t1 out rate p50 p99 lost cpu
  t0=$(cpu_ticks "$pid")
  out=$(./target/release/amqp-bench --rpc --messages "$n" --size 1024 "$@" 2>/dev/null) || true
  t1=$(cpu_ticks "$pid")
  rate=$(echo "$out" | sed -n 's/.* = \([0-9]*\) msg\/s.*/\1/p')
  p50=$(echo "$out" | sed -n 's/^latency p50 \([^ ]*\) .*/\1/p')
  p99=$(echo "$out" | sed -n 's/.* p99 \([^ ]*\) .*/\1/p')
  lost=$(echo "$out" | sed -n 's/^lost \([0-9]*\) .*/\1/p')
  cpu=$(awk -v d=$((t1 - t0)) -v clk="$CLK" -v n="$n" 'BEGIN { printf "%.1f", d / clk / n * 1e6 }')
  echo "| $name | ${rate:-FAILED} | $p50 | $p99 | ${lost:-?} | $cpu |"
}

echo "| load (1 KiB) | round trips/s | p50 | p99 | unanswered | server CPU µs/round trip |"
echo "|---|---|---|---|---|---|"
row "connector: queries at 1,000/s, 1 requester, 1 responder" "$CONN" 10000 \
  --url "amqp://127.0.0.1:$PORT" --address queries/bench.rate --rate 1000 --pipeline 64
row "connector: commands at 1,000/s" "$CONN" 10000 \
  --url "amqp://127.0.0.1:$PORT" --address commands/bench.rate --rate 1000 --pipeline 64
row "connector: queries, 64 in flight (2 requesters × 32, 2 responders in a group)" "$CONN" "$N" \
  --url "amqp://127.0.0.1:$PORT" --address queries/bench.max --producers 2 --consumers 2 --group g --pipeline 32 --credit 200
row "gRPC straight to a store: queries at 1,000/s" "$FACADE" 10000 \
  --grpc "127.0.0.1:$GRPC" --address queries/bench.grpc.rate --rate 1000 --pipeline 64
row "gRPC straight to a store: queries, 64 in flight" "$FACADE" "$N" \
  --grpc "127.0.0.1:$GRPC" --address queries/bench.grpc.max --producers 2 --consumers 2 --group g --pipeline 32
