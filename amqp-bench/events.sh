#!/usr/bin/env bash
# Events through the connector (embedded store): fan-out 1 → 3 at rising publish rates, a
# consumer group, and an events-store replay; then the same fan-out through RabbitMQ 3.10's AMQP
# 1.0 plugin (Debian's package) publishing to /topic/<key> with 3 subscribers. Same tool, same
# client (amqp-bench's lean client), same run. Prints markdown tables. Not part of CI.
# Needs root (apt-get) for RabbitMQ; set SKIP_RABBITMQ=1 to measure the connector alone.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-200000}
CONN_PORT=5684
HTTP_PORT=8094
RMQ_PORT=5673
CLK=$(getconf CLK_TCK)
cargo build --release --quiet -p kubemq-amqp-connector -p amqp-bench

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
dropped() { curl -s "127.0.0.1:$HTTP_PORT/metrics" | awk '/^kubemq_amqp10_events_dropped_no_credit_total/ {print $2}'; }

CONN_PID=
started_rmq=0
DATA=$(mktemp -d)
trap '[ -n "$CONN_PID" ] && kill $CONN_PID 2>/dev/null; rm -rf "$DATA"; [ $started_rmq = 1 ] && rabbitmqctl -q stop >/dev/null 2>&1 || true' EXIT
./target/release/kubemq-amqp-connector --port $CONN_PORT --bind-address 127.0.0.1 --data-dir "$DATA" \
  --http-address "127.0.0.1:$HTTP_PORT" >/dev/null 2>&1 &
CONN_PID=$!
sleep 1

# bench NAME PID URL ADDRESS DELIVERIES-PER-MESSAGE ARGS...: one row.
bench() {
  local name=$1 pid=$2 url=$3 address=$4 copies=$5
  shift 5
  local t0 t1 out rate lost cpu
  t0=$(cpu_ticks "$pid")
  out=$(./target/release/amqp-bench --client lean --url "$url" --address "$address" "$@" 2>/dev/null) || true
  t1=$(cpu_ticks "$pid")
  rate=$(echo "$out" | sed -n 's/.* = \([0-9]*\) msg\/s.*/\1/p')
  lost=$(echo "$out" | sed -n 's/^lost \([0-9]*\) .*/\1/p')
  cpu=$(awk -v d=$((t1 - t0)) -v clk="$CLK" -v n="$((N * copies))" 'BEGIN { printf "%.2f", d / clk / n * 1e6 }')
  echo "| $name | ${rate:-FAILED} | ${lost:-?} | $cpu |"
}

echo "| load (1 KiB, $N events, credit 5000) | deliveries/s | messages lost | server CPU µs/delivery |"
echo "|---|---|---|---|"
for rate in 15000 20000 25000; do
  d0=$(dropped)
  bench "connector: events 1 → 3, published at $rate/s" "$CONN_PID" "amqp://127.0.0.1:$CONN_PORT" "events/fan$rate" 3 \
    --fanout --consumers 3 --messages "$N" --credit 5000 --presettled --pipeline 1000 --rate "$rate"
  echo "|  (dropped at zero credit: $(( $(dropped) - d0 ))) | | | |"
done
bench "connector: events, a group of 2, published at 40000/s" "$CONN_PID" "amqp://127.0.0.1:$CONN_PORT" "events/group" 1 \
  --group g --consumers 2 --messages "$N" --credit 5000 --presettled --pipeline 1000 --rate 40000
bench "connector: events-store replay of $N stored events, 1 subscriber" "$CONN_PID" "amqp://127.0.0.1:$CONN_PORT" "events-store/replay" 1 \
  --replay --start first --consumers 1 --messages "$N" --credit 5000 --pipeline 1000

[ "${SKIP_RABBITMQ:-0}" = 1 ] && exit 0
command -v rabbitmq-server >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null; }
rabbitmq-plugins enable --offline rabbitmq_amqp1_0 >/dev/null
if ! rabbitmqctl -q status >/dev/null 2>&1; then
  RABBITMQ_NODE_PORT=$RMQ_PORT rabbitmq-server >/tmp/events-rabbitmq.log 2>&1 &
  started_rmq=1
  for _ in $(seq 60); do rabbitmqctl -q await_startup >/dev/null 2>&1 && break; sleep 1; done
  rabbitmqctl -q await_startup
fi
RMQ_PID=$(pgrep -f beam.smp | head -1)
for rate in 15000 20000 25000; do
  bench "RabbitMQ 3.10: /topic 1 → 3, published at $rate/s" "$RMQ_PID" "amqp://guest:guest@127.0.0.1:$RMQ_PORT" "/topic/fan$rate" 3 \
    --fanout --consumers 3 --messages "$N" --credit 5000 --presettled --pipeline 1000 --rate "$rate"
done
