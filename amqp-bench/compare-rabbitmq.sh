#!/usr/bin/env bash
# Side-by-side: this connector (embedded store, durable, at-least-once) and RabbitMQ 3.10 with its
# AMQP 1.0 plugin (Debian's package, durable classic queues addressed as /amq/queue/<name>),
# driven by amqp-bench with the same load. Prints a markdown table. Not part of CI.
# Needs root (apt-get) and about two minutes. Loopback only.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-50000}
RMQ_PORT=5673
CONN_PORT=5682
CLK=$(getconf CLK_TCK)

command -v rabbitmq-server >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null; }
python3 -c 'import pika' 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check pika
rabbitmq-plugins enable --offline rabbitmq_amqp1_0 >/dev/null
cargo build --release --quiet -p kubemq-amqp-connector -p amqp-bench

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hwm_kib() { awk '/VmHWM/ {print $2}' "/proc/$1/status"; }

started_rmq=0
CONN_PID=
DATA=$(mktemp -d)
# Set before anything can fail, so a failed run never leaves a broker behind.
trap '[ -n "$CONN_PID" ] && kill $CONN_PID 2>/dev/null; rm -rf "$DATA"; [ $started_rmq = 1 ] && rabbitmqctl -q stop >/dev/null 2>&1 || true' EXIT
if ! rabbitmqctl -q status >/dev/null 2>&1; then
  RABBITMQ_NODE_PORT=$RMQ_PORT rabbitmq-server >/tmp/compare-rabbitmq.log 2>&1 &
  started_rmq=1
  # The node registers with epmd a moment after start; await_startup fails until then.
  for _ in $(seq 60); do rabbitmqctl -q await_startup >/dev/null 2>&1 && break; sleep 1; done
  rabbitmqctl -q await_startup
fi
RMQ_PID=$(pgrep -f beam.smp | head -1)
python3 - <<'PY'
import pika
c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", 5673))
ch = c.channel()
for q in ("bench", "lat", "idle"):
    ch.queue_declare(q, durable=True)
    ch.queue_purge(q)
c.close()
PY

./target/release/kubemq-amqp-connector --port $CONN_PORT --bind-address 127.0.0.1 --data-dir "$DATA" --http-address off >/dev/null 2>&1 &
CONN_PID=$!
sleep 1

# run NAME PID URL PREFIX: throughput, CPU per message, latency at 2,000 msg/s, idle delivery.
run() {
  local name=$1 pid=$2 url=$3 prefix=$4
  local t0 t1 out rate cpu lat idle
  t0=$(cpu_ticks "$pid")
  # amqp-bench exits non-zero on a lost message: say so in the table instead of stopping silently.
  if ! out=$(./target/release/amqp-bench --url "$url" --address "${prefix}bench" --messages "$N" --producers 2 --consumers 2 --pipeline 100 --credit 100 2>/dev/null); then
    echo "| $name | FAILED: $(echo "$out" | tail -1) | | | | |"
    return
  fi
  t1=$(cpu_ticks "$pid")
  rate=$(echo "$out" | sed -n 's/.* = \([0-9]*\) msg\/s.*/\1/p')
  cpu=$(awk -v d=$((t1 - t0)) -v clk="$CLK" -v n="$N" 'BEGIN { printf "%.0f", d / clk / n * 1e6 }')
  lat=$(./target/release/amqp-bench --url "$url" --address "${prefix}lat" --messages 20000 --rate 2000 2>/dev/null | sed -n 's/latency p50 \([^ ]*\) p90 [^ ]* p99 \([^ ]*\) .*/p50 \1, p99 \2/p')
  idle=$(./target/release/amqp-bench --url "$url" --address "${prefix}idle" --messages 200 --rate 20 2>/dev/null | sed -n 's/latency p50 [^ ]* p90 [^ ]* p99 \([^ ]*\) .*/p99 \1/p')
  echo "| $name | $rate | $cpu | $lat | $idle | $(( $(hwm_kib "$pid") / 1024 )) |"
}

echo "| server | msg/s (2+2, 100 in flight, credit 100, 1 KiB, $N msgs) | server CPU µs/msg | latency at 2,000 msg/s | idle-queue delivery | peak RSS MiB |"
echo "|---|---|---|---|---|---|"
run "kubemq-amqp-connector (embedded store)" "$CONN_PID" "amqp://127.0.0.1:$CONN_PORT" "queues/"
run "RabbitMQ 3.10 + amqp1_0 plugin" "$RMQ_PID" "amqp://guest:guest@127.0.0.1:$RMQ_PORT" "/amq/queue/"
