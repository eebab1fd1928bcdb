#!/usr/bin/env bash
# Figures through a real KubeMQ (BENCHMARKS.md, "Through a real KubeMQ"). Runs the KubeMQ binary
# named by KUBEMQ_BINARY (else $HOME/.cache/kubemq-amqp/kubemq-community; this script never
# builds it) with one or two connectors in front of it, all in a network namespace with nothing
# but loopback (root and unshare needed: KubeMQ binds every interface and reports usage to an
# outside host; its report also goes to a closed local port). Not part of CI.
#
#   bash amqp-bench/real-kubemq.sh throughput   # connector vs straight gRPC, alternating ROUNDS
#   bash amqp-bench/real-kubemq.sh latency      # 500, 2,000 and 10,000 msg/s, and the idle queue
#   bash amqp-bench/real-kubemq.sh neighbour    # a busy queue alone and beside an idle consumer
#   bash amqp-bench/real-kubemq.sh scale-out    # one connector, then two, RUNS runs each
#   bash amqp-bench/real-kubemq.sh neighbours   # a busy queue beside 0, 10, 100, 1,000 idle
#                                               # consumers; idle CPU; idle-queue latency
set -euo pipefail
cd "$(dirname "$0")/.."
KUBEMQ=${KUBEMQ_BINARY:-$HOME/.cache/kubemq-amqp/kubemq-community}
[ -x "$KUBEMQ" ] || { echo "no KubeMQ binary at $KUBEMQ" >&2; exit 2; }
if [ -z "${IN_NETNS:-}" ]; then
  cargo build --release --quiet -p kubemq-amqp-connector -p amqp-bench
  exec unshare --net -- env IN_NETNS=1 bash -c 'ip link set lo up && exec bash "$0" "$@"' "$0" "$@"
fi
B=./target/release
N=${N:-100000}
ROUNDS=${ROUNDS:-3}
RUNS=${RUNS:-5}
CLK=$(getconf CLK_TCK)
DATA=$(mktemp -d)
PIDS=()
trap 'kill "${PIDS[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$DATA"' EXIT

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
wait_port() { until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do sleep 0.1; done; }

(cd "$DATA" && GRPC_PORT=50000 REST_PORT=9090 API_PORT=8081 STORE_STORE_PATH=./store \
  HTTPS_PROXY=http://127.0.0.1:9 HTTP_PROXY=http://127.0.0.1:9 \
  exec env -u KUBERNETES_SERVICE_HOST "$KUBEMQ" server >kubemq.log 2>&1) &
KUBEMQ_PID=$!
PIDS+=("$KUBEMQ_PID")
wait_port 50000
connector() { # port
  $B/kubemq-amqp-connector --kubemq-address 127.0.0.1:50000 --port "$1" --http-address off \
    >"$DATA/connector-$1.log" 2>&1 &
  PIDS+=($!)
  wait_port "$1"
}
connector 5672
CONNECTOR_PID=${PIDS[-1]}
sleep 1

# usage: bench LABEL -- amqp-bench args; prints the result with CPU µs per message of the load
# tool, KubeMQ and (over AMQP) the connector.
bench() {
  local label=$1; shift 2
  local k0 c0 out n
  settle_down
  k0=$(cpu_ticks "$KUBEMQ_PID"); c0=$(cpu_ticks "$CONNECTOR_PID")
  # amqp-bench exits 1 when a message was lost: the line says so, and the runs go on.
  out=$(/usr/bin/time -f "tool_cpu %U %S" $B/amqp-bench "$@" 2>&1) || true
  n=$(sed -n 's/^messages \([0-9]*\) .*/\1/p' <<<"$out")
  awk -v l="$label" -v n="$n" -v c="$CLK" -v k="$(( $(cpu_ticks "$KUBEMQ_PID") - k0 ))" \
      -v x="$(( $(cpu_ticks "$CONNECTOR_PID") - c0 ))" '
    / = [0-9]+ msg\/s/ { rate = $(NF - 1) }
    /^latency/ { lat = $0 }
    /^lost/ { lost = $0 }
    /^tool_cpu/ { tool = ($2 + $3) * 1e6 / n }
    END { printf "%s: %s msg/s; %s; %s; CPU µs/msg: tool %.1f, KubeMQ %.1f, connector %.1f\n",
          l, rate, lat, lost, tool, k / c * 1e6 / n, x / c * 1e6 / n }' <<<"$out"
}
# A run's last Get may still wait in KubeMQ for up to a second after its client is gone, and
# holds one of KubeMQ's pooled clients meanwhile, stalling the Gets of the next run that draw it
# (KMQ-21): each run waits that out first.
settle_down() { sleep 1.5; }

case "${1:-}" in
throughput)
  for r in $(seq "$ROUNDS"); do
    # One Get stream per queue: two concurrent Get streams on one KubeMQ queue strand and
    # duplicate messages (KMQ-10), so the straight ceiling is one consumer, as the connector's
    # shared Get loop is.
    bench "round $r direct gRPC" -- --grpc 127.0.0.1:50000 --address "queues/direct$r" \
      --messages "$N" --producers 2 --consumers 1
    bench "round $r AMQP (lean) via connector" -- --client lean --address "queues/amqp$r" \
      --messages "$N" --producers 2 --consumers 2
  done
  ;;
latency)
  for rate in ${RATES:-500 2000 10000}; do
    for r in $(seq "$ROUNDS"); do
      # Straight over gRPC a Get of 100 waits for 100 messages or its second (KMQ-6): the
      # floor is a Get of one per round.
      bench "$rate msg/s direct gRPC" -- --grpc 127.0.0.1:50000 --address "queues/ld$rate$r" \
        --messages $((rate * 10)) --rate "$rate" --pipeline 100 --credit 1
      # Accepting each message, as the straight client acknowledges each; then settling half
      # the window at a time (amqp-bench's default), which keeps transactions open on KubeMQ.
      bench "$rate msg/s via connector, accept each" -- --address "queues/la$rate$r" \
        --messages $((rate * 10)) --rate "$rate" --pipeline 100 --credit 100 --settle-every 1
      bench "$rate msg/s via connector, settle 50 at a time" -- --address "queues/lh$rate$r" \
        --messages $((rate * 10)) --rate "$rate" --pipeline 100 --credit 100
    done
  done
  for settle in 1 5; do
    for r in $(seq "$RUNS"); do
      bench "idle queue, accept every $settle" -- --address "queues/idle$settle.$r" \
        --messages 2000 --rate 200 --credit 10 --settle-every "$settle" --pipeline 10
    done
  done
  ;;
neighbour)
  # KMQ-21: a consumer of another, idle queue keeps one of KubeMQ's pooled clients in a waiting
  # Get; a busy queue's Gets pass through that client in turn.
  for r in $(seq "$ROUNDS"); do
    bench "2000 msg/s alone" -- --address "queues/nb$r" --messages 20000 --rate 2000 \
      --pipeline 100 --credit 100 --settle-every 1
    $B/amqp-bench --address "queues/idle-neighbour$r" --messages 30 --rate 1 --credit 10 \
      --settle-every 1 >/dev/null 2>&1 &
    idle=$!
    sleep 2
    bench "2000 msg/s beside an idle consumer" -- --address "queues/nn$r" --messages 20000 \
      --rate 2000 --pipeline 100 --credit 100 --settle-every 1
    wait "$idle" || true
  done
  ;;
neighbours)
  # KMQ-21: every Get holds one of KubeMQ's 200 pooled clients while it waits; idle queues are
  # watched instead (docs/decisions.md, "Idle queues are watched"). NEIGHBOURS consumers wait on
  # other, empty queues of the same connector while a busy queue is measured.
  idle_pid=
  hold_idle() { # count
    idle_pid=
    [ "$1" -gt 0 ] || return 0
    coproc IDLE { exec $B/idle-consumers amqp://127.0.0.1:5672 "idle$RANDOM" "$1" 10; }
    idle_pid=$IDLE_PID
    read -r line <&"${IDLE[0]}"; echo "  ($line)"
    sleep 2
  }
  release_idle() {
    [ -n "$idle_pid" ] || return 0
    kill -TERM "$idle_pid"; wait "$idle_pid" 2>/dev/null || true
  }
  # A fresh KubeMQ answers its first Gets and sends slowly: warm it up first.
  bench "warm-up" -- --address queues/warm-up --messages 5000 --rate 2000 --pipeline 100 \
    --credit 100 --settle-every 1 >/dev/null
  for r in $(seq "$ROUNDS"); do
    for rate in ${RATES:-2000 10000}; do
      for n in ${NEIGHBOURS:-0 10 100 1000}; do
        hold_idle "$n"
        bench "round $r: $rate msg/s beside $n idle consumers" -- \
          --address "queues/busy$rate.$n.$r" --messages $((rate * 10)) --rate "$rate" \
          --pipeline 100 --credit 100 --settle-every 1
        release_idle
      done
    done
  done
  for n in ${IDLE_CPU:-100 1000}; do
    hold_idle "$n"
    k0=$(cpu_ticks "$KUBEMQ_PID"); c0=$(cpu_ticks "$CONNECTOR_PID")
    sleep 30
    awk -v n="$n" -v c="$CLK" -v k="$(( $(cpu_ticks "$KUBEMQ_PID") - k0 ))" \
        -v x="$(( $(cpu_ticks "$CONNECTOR_PID") - c0 ))" \
      'BEGIN { printf "%s idle consumers, nothing sent, 30 s: KubeMQ %.2f %% of a core, connector %.2f %%\n", n, k / c / 30 * 100, x / c / 30 * 100 }'
    release_idle
  done
  hold_idle 100
  for r in $(seq "$ROUNDS"); do
    bench "round $r: idle queue beside 100 idle consumers, sent through the connector" -- \
      --address "queues/lone$r" --messages 200 --rate 20 --pipeline 10 --credit 10 \
      --settle-every 1
    bench "round $r: idle queue beside 100 idle consumers, sent by a gRPC client" -- \
      --address "queues/far$r" --messages 200 --rate 20 --pipeline 10 --credit 10 \
      --settle-every 1 --producer-grpc 127.0.0.1:50000
  done
  release_idle
  ;;
scale-out)
  for r in $(seq "$RUNS"); do
    bench "one connector, 4 receivers" -- --address "queues/so1.$r" --messages 10000 \
      --consumers 4 --credit 100 --settle-every 1
  done
  connector 5673
  for r in $(seq "$RUNS"); do
    bench "two connectors, 2 receivers each" -- --address "queues/so2.$r" --messages 10000 \
      --consumers 4 --credit 100 --settle-every 1 \
      --consumer-url amqp://127.0.0.1:5672 --consumer-url amqp://127.0.0.1:5673
  done
  ;;
*)
  echo "usage: $0 throughput|latency|neighbour|neighbours|scale-out" >&2
  exit 2
  ;;
esac
