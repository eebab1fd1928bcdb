#!/usr/bin/env bash
# The connector's own overhead: one connector serves its embedded store as KubeMQ's
# gRPC API; a second one speaks AMQP in front of it. The same load runs through the second one
# (amqp-bench's lean AMQP client; CLIENT=fe2o3 for the third-party one), straight at the gRPC
# server (amqp-bench --grpc), and straight at it through tcp-forward (a byte-for-byte TCP
# forwarder: what an extra process that does no protocol work costs on this machine),
# alternating, ROUNDS times, with every process's CPU per message.
# Not part of CI. Loopback only; ports 50000, 50001 and 5672/5674.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-300000}
ROUNDS=${ROUNDS:-6}
CLIENT=${CLIENT:-lean}
CLK=$(getconf CLK_TCK)
B=./target/release
cargo build --release --quiet -p kubemq-amqp-connector -p amqp-bench

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
STORE=
FRONT=
FORWARD=
DATA=$(mktemp -d)
trap 'for p in $STORE $FRONT $FORWARD; do kill $p 2>/dev/null; done; rm -rf "$DATA"' EXIT

# usage: bench LABEL NAME=PID... -- amqp-bench args; prints throughput and CPU µs per message
bench() {
  local label=$1; shift
  local pids=()
  while [ "$1" != "--" ]; do pids+=("$1"); shift; done; shift
  local before=() p
  for p in "${pids[@]}"; do before+=("$(cpu_ticks "${p#*=}")"); done
  local out
  out=$(/usr/bin/time -f "tool_cpu %U %S" $B/amqp-bench "$@" --messages "$N" --producers 2 --consumers 2 2>&1)
  local rate tool
  rate=$(sed -n 's/.* = \([0-9]*\) msg\/s/\1/p' <<<"$out")
  tool=$(awk -v n="$N" '/^tool_cpu/ {printf "%.1f", ($2 + $3) * 1e6 / n}' <<<"$out")
  local line="$label: $rate msg/s; CPU per message: load tool $tool µs"
  local i=0
  for p in "${pids[@]}"; do
    line+=", ${p%%=*} $(awk -v a="${before[$i]}" -v b="$(cpu_ticks "${p#*=}")" -v n="$N" -v c="$CLK" 'BEGIN {printf "%.1f", (b - a) / c * 1e6 / n}') µs"
    i=$((i + 1))
  done
  grep -q "^lost 0 duplicated 0" <<<"$out" || line+=" (LOSS: $(grep '^lost' <<<"$out"))"
  echo "$line"
  LAST_RATE=$rate
}

$B/kubemq-amqp-connector --data-dir "$DATA" --serve-kubemq-grpc 127.0.0.1:50000 --port 5674 --http-address off >/dev/null 2>&1 &
STORE=$!
sleep 1
$B/kubemq-amqp-connector --kubemq-address 127.0.0.1:50000 --http-address off >/dev/null 2>&1 &
FRONT=$!
$B/tcp-forward 127.0.0.1:50001 127.0.0.1:50000 >/dev/null &
FORWARD=$!
sleep 1
# Each round's shares are over the direct run in the same round, so that a slow spell of this
# (shared, virtual) machine weighs on both sides of the ratio alike.
share() { awk -v a="$1" -v d="$2" 'BEGIN {printf "%.1f", 100 * a / d}'; }
summary() { sort -n | awk '{v[NR] = $1; s += $1} END {printf "mean %.1f %%, median %.1f %%", s / NR, (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}'; }
SHARES=()
FORWARDED=()
for r in $(seq "$ROUNDS"); do
  bench "round $r AMQP     " "store=$STORE" "connector=$FRONT" -- --client "$CLIENT" --address "queues/amqp-$r"
  amqp=$LAST_RATE
  bench "round $r direct   " "store=$STORE" -- --grpc 127.0.0.1:50000 --address "queues/direct-$r"
  direct=$LAST_RATE
  bench "round $r forwarded" "store=$STORE" "tcp-forward=$FORWARD" -- --grpc 127.0.0.1:50001 --address "queues/forwarded-$r"
  SHARES+=("$(share "$amqp" "$direct")")
  FORWARDED+=("$(share "$LAST_RATE" "$direct")")
  echo "round $r shares of direct: AMQP ${SHARES[-1]} %, forwarded ${FORWARDED[-1]} %"
done
echo "AMQP through the connector, share of direct throughput: $(printf '%s\n' "${SHARES[@]}" | summary)"
echo "direct through tcp-forward, share of direct throughput: $(printf '%s\n' "${FORWARDED[@]}" | summary)"
