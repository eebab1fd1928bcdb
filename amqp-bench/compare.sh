#!/usr/bin/env bash
# Side by side, on loopback only, driven by amqp-bench with the same loads (1 KiB durable messages,
# at-least-once): this connector on its embedded store; RabbitMQ 3.10 with its AMQP 1.0 plugin
# (Debian's package, durable classic queues declared with pika, addressed as /amq/queue/<name>);
# Apache ActiveMQ Artemis 2.40.0 (Maven Central's org.apache.activemq:apache-artemis:2.40.0 bin
# tarball, an instance with a persistent NIO journal and anycast queues). Prints markdown tables:
# the full load (throughput, server CPU, peak RSS), then one table per steady rate with REPS
# repetitions that alternate between the servers, and the connector's own account of where its
# messages' time went at each rate. Not part of CI. Needs root (apt-get), Java 17 and about
# 10 minutes with the defaults.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-50000}
RATES=${RATES:-500 2000 10000}
SECS=${SECS:-15}
REPS=${REPS:-2}
CACHE=${KUBEMQ_AMQP_BENCH_CACHE:-$HOME/.cache/kubemq-amqp-bench}
ARTEMIS_VERSION=2.40.0
RMQ_PORT=5673
CONN_PORT=5682
CONN_HTTP=9182
ARTEMIS_OFFSET=100
ARTEMIS_PORT=$((5672 + ARTEMIS_OFFSET))
CLK=$(getconf CLK_TCK)

command -v rabbitmq-server >/dev/null || { apt-get update -qq; DEBIAN_FRONTEND=noninteractive apt-get install -y -qq rabbitmq-server >/dev/null; }
python3 -c 'import pika' 2>/dev/null || python3 -m pip install --quiet --disable-pip-version-check pika
rabbitmq-plugins enable --offline rabbitmq_amqp1_0 >/dev/null
ARTEMIS_HOME="$CACHE/apache-artemis-$ARTEMIS_VERSION"
if [ ! -x "$ARTEMIS_HOME/bin/artemis" ]; then
  mkdir -p "$CACHE"
  curl -sSfL "https://repo1.maven.org/maven2/org/apache/activemq/apache-artemis/$ARTEMIS_VERSION/apache-artemis-$ARTEMIS_VERSION-bin.tar.gz" |
    tar xz -C "$CACHE"
fi
cargo build --release --quiet -p kubemq-amqp-connector -p amqp-bench
B=./target/release

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hwm_kib() { awk '/VmHWM/ {print $2}' "/proc/$1/status"; }
wait_port() { for _ in $(seq 600); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return; sleep 0.1; done; return 1; }

# Every queue a run uses, declared up front: RabbitMQ's plugin and the Artemis instance address
# existing queues only, and a fresh queue per run keeps one run's leftovers out of the next.
queues=(bench idle)
for rep in $(seq "$REPS"); do for rate in $RATES; do queues+=("lat${rate}_$rep"); done; done

started_rmq=0
CONN_PID=
ARTEMIS_PID=
DATA=$(mktemp -d)
# Set before anything can fail, so a failed run never leaves a broker behind.
cleanup() {
  [ -n "$CONN_PID" ] && kill "$CONN_PID" 2>/dev/null
  [ -n "$ARTEMIS_PID" ] && kill "$ARTEMIS_PID" 2>/dev/null
  [ "$started_rmq" = 1 ] && rabbitmqctl -q stop >/dev/null 2>&1
  wait 2>/dev/null
  rm -rf "$DATA"
}
trap cleanup EXIT
if ! rabbitmqctl -q status >/dev/null 2>&1; then
  RABBITMQ_NODE_PORT=$RMQ_PORT RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 rabbitmq-server >"$DATA/rabbitmq.log" 2>&1 &
  started_rmq=1
  # The node registers with epmd a moment after start; await_startup fails until then.
  for _ in $(seq 60); do rabbitmqctl -q await_startup >/dev/null 2>&1 && break; sleep 1; done
  rabbitmqctl -q await_startup
fi
RMQ_PID=$(pgrep -f beam.smp | head -1)
python3 - "$RMQ_PORT" "${queues[@]}" <<'PY'
import sys, pika
c = pika.BlockingConnection(pika.ConnectionParameters("127.0.0.1", int(sys.argv[1])))
ch = c.channel()
for q in sys.argv[2:]:
    ch.queue_declare(q, durable=True)
    ch.queue_purge(q)
c.close()
PY

artemis_queues=$(printf '%s:anycast,' "${queues[@]}")
"$ARTEMIS_HOME/bin/artemis" create --silent --force --user bench --password bench --require-login \
  --nio --host 127.0.0.1 --http-host 127.0.0.1 --no-web --port-offset "$ARTEMIS_OFFSET" \
  --no-hornetq-acceptor --no-mqtt-acceptor --no-stomp-acceptor \
  --queues "${artemis_queues%,}" "$DATA/artemis" >"$DATA/artemis-create.log"
"$DATA/artemis/bin/artemis" run >"$DATA/artemis.log" 2>&1 &
ARTEMIS_PID=$!
wait_port "$ARTEMIS_PORT"

$B/kubemq-amqp-connector --port $CONN_PORT --bind-address 127.0.0.1 --data-dir "$DATA/connector" \
  --http-address "127.0.0.1:$CONN_HTTP" >"$DATA/connector.log" 2>&1 &
CONN_PID=$!
wait_port "$CONN_PORT"

servers=(connector rabbitmq artemis)
declare -A label=(
  [connector]="kubemq-amqp-connector (embedded store)"
  [rabbitmq]="RabbitMQ 3.10 + amqp1_0 plugin"
  [artemis]="Artemis $ARTEMIS_VERSION (NIO journal)"
)
declare -A url=(
  [connector]="amqp://127.0.0.1:$CONN_PORT"
  [rabbitmq]="amqp://guest:guest@127.0.0.1:$RMQ_PORT"
  [artemis]="amqp://bench:bench@127.0.0.1:$ARTEMIS_PORT"
)
declare -A prefix=([connector]="queues/" [rabbitmq]="/amq/queue/" [artemis]="")
declare -A pid=([connector]=$CONN_PID [rabbitmq]=$RMQ_PID [artemis]=$ARTEMIS_PID)

# ms NAME VALUE: a Rust Duration as amqp-bench prints it (850.1µs, 4.2ms, 1.3s), in ms.
ms() {
  awk -v v="$1" 'BEGIN {
    if (v ~ /µs$/) { sub(/µs$/, "", v); printf "%.2f", v / 1000 }
    else if (v ~ /ns$/) { sub(/ns$/, "", v); printf "%.3f", v / 1e6 }
    else if (v ~ /ms$/) { sub(/ms$/, "", v); printf "%.2f", v }
    else if (v ~ /s$/) { sub(/s$/, "", v); printf "%.0f", v * 1000 }
    else printf "%s", v }'
}

# Every run starts with the page cache clean: a run leaves up to 150 MB for the kernel to write
# back, and whoever ran next paid for it (the full loads' 50,000 messages showed as a stall in
# the first steady run, whichever server it was).
quiesce() { sync; sleep 1; }

echo "| server | msg/s (2+2, 100 in flight, credit 100, 1 KiB, $N msgs) | server CPU µs/msg | peak RSS MiB |"
echo "|---|---|---|---|"
for s in "${servers[@]}"; do
  quiesce
  t0=$(cpu_ticks "${pid[$s]}")
  # amqp-bench exits non-zero on a lost message: say so in the table instead of stopping silently.
  if ! out=$($B/amqp-bench --url "${url[$s]}" --address "${prefix[$s]}bench" --messages "$N" --producers 2 --consumers 2 --pipeline 100 --credit 100 2>/dev/null); then
    echo "| ${label[$s]} | FAILED: $(echo "$out" | tail -1) | | |"
    continue
  fi
  t1=$(cpu_ticks "${pid[$s]}")
  rate=$(echo "$out" | sed -n 's/.* = \([0-9]*\) msg\/s.*/\1/p')
  cpu=$(awk -v d=$((t1 - t0)) -v clk="$CLK" -v n="$N" 'BEGIN { printf "%.0f", d / clk / n * 1e6 }')
  echo "| ${label[$s]} | $rate | $cpu | $(( $(hwm_kib "${pid[$s]}") / 1024 )) |"
done

# The steady rates: one producer with 100 in flight, one consumer with credit 100 settling 50 at
# a time, SECS seconds each; the servers take turns within each repetition, and each repetition
# starts with a different one.
declare -A lat stages
for rep in $(seq "$REPS"); do
  order=("${servers[@]:$(((rep - 1) % ${#servers[@]}))}" "${servers[@]:0:$(((rep - 1) % ${#servers[@]}))}")
  for rate in $RATES; do
    for s in "${order[@]}"; do
      quiesce
      extra=()
      [ "$s" = connector ] && extra=(--stages "http://127.0.0.1:$CONN_HTTP")
      out=$($B/amqp-bench --url "${url[$s]}" --address "${prefix[$s]}lat${rate}_$rep" \
        --messages $((rate * SECS)) --rate "$rate" --pipeline 100 --credit 100 "${extra[@]}" 2>/dev/null) || true
      line=$(echo "$out" | sed -n 's/^latency p50 \([^ ]*\) p90 [^ ]* p99 \([^ ]*\) p999 \([^ ]*\) max \([^ ]*\)$/\1 \2 \3 \4/p')
      lost=$(echo "$out" | sed -n 's/^lost \([0-9]*\) .*/\1/p')
      if [ -z "$line" ]; then
        lat[$s,$rate,$rep]="FAILED FAILED FAILED FAILED"
      else
        read -r a b c d <<<"$line"
        lat[$s,$rate,$rep]="$(ms "$a") $(ms "$b") $(ms "$c") $(ms "$d")"
        [ "${lost:-0}" != 0 ] && lat[$s,$rate,$rep]+=" lost:$lost"
      fi
      [ "$s" = connector ] && stages[$rate,$rep]=$(echo "$out" | grep '^connector ' || true)
    done
  done
done

for rate in $RATES; do
  echo
  echo "At $rate msg/s ($((rate * SECS)) messages a run; $REPS runs, in ms, run 1 · run 2 …):"
  echo
  echo "| server | p50 | p99 | p999 | max |"
  echo "|---|---|---|---|---|"
  for s in "${servers[@]}"; do
    cols=()
    for i in 1 2 3 4; do
      v=()
      for rep in $(seq "$REPS"); do v+=("$(echo "${lat[$s,$rate,$rep]}" | awk -v i="$i" '{ print $i }')"); done
      cols+=("$(IFS='·'; echo "${v[*]}" | sed 's/·/ · /g')")
    done
    lost=()
    for rep in $(seq "$REPS"); do
      l=$(echo "${lat[$s,$rate,$rep]}" | awk '{ print $5 }')
      [ -n "$l" ] && lost+=("run $rep $l")
    done
    echo "| ${label[$s]} | ${cols[0]} | ${cols[1]} | ${cols[2]} | ${cols[3]}${lost:+ (${lost[*]})} |"
  done
  for rep in $(seq "$REPS"); do
    echo
    echo "Connector stages, run $rep:"
    echo '```'
    echo "${stages[$rate,$rep]}"
    echo '```'
  done
done
