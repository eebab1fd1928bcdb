#!/usr/bin/env bash
# What TLS costs the connector: the queues load (2 producers, 2 consumers, 1 KiB, every message
# accepted, amqp-bench's lean client) over plain AMQP and over TLS to one connector on its
# embedded store, alternating, ROUNDS times, with the connector's CPU per message; then TLS
# handshakes per second on one core (the connector pinned to core 1, OpenSSL's s_time making new
# sessions from core 0); then the resident memory per idle connection, plain and TLS (idle-rss).
# Certificates are made here with openssl. Not part of CI. Loopback only; ports 5672 and 5671.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-300000}
ROUNDS=${ROUNDS:-3}
CLK=$(getconf CLK_TCK)
B=./target/release
cargo build --release --quiet -p kubemq-amqp-connector -p amqp-bench -p interop-tests \
  --bin kubemq-amqp-connector --bin amqp-bench --bin idle-rss

WORK=$(mktemp -d)
CONNECTOR=
trap '[ -z "$CONNECTOR" ] || kill $CONNECTOR 2>/dev/null; rm -rf "$WORK"' EXIT
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=bench-ca \
  -keyout "$WORK/ca.key" -out "$WORK/ca.pem" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=127.0.0.1 -keyout "$WORK/server.key" \
  -out "$WORK/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' > "$WORK/san.ext"
openssl x509 -req -in "$WORK/server.csr" -CA "$WORK/ca.pem" -CAkey "$WORK/ca.key" \
  -CAcreateserial -days 2 -extfile "$WORK/san.ext" -out "$WORK/server.pem" 2>/dev/null

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
$B/kubemq-amqp-connector --data-dir "$WORK/data" --http-address off --bind-address 127.0.0.1 \
  --tls-cert-file "$WORK/server.pem" --tls-key-file "$WORK/server.key" >/dev/null 2>&1 &
CONNECTOR=$!
sleep 1

# usage: run LABEL amqp-bench-args...; prints msg/s and the connector's CPU µs per message
run() {
  local label=$1; shift
  local before out rate cpu
  before=$(cpu_ticks $CONNECTOR)
  out=$($B/amqp-bench --client lean --messages "$N" --producers 2 --consumers 2 "$@" 2>&1)
  rate=$(sed -n 's/.* = \([0-9]*\) msg\/s/\1/p' <<<"$out")
  cpu=$(awk -v a="$before" -v b="$(cpu_ticks $CONNECTOR)" -v n="$N" -v c="$CLK" 'BEGIN {printf "%.2f", (b - a) / c * 1e6 / n}')
  grep -q "^lost 0 duplicated 0" <<<"$out" || { echo "$label: LOSS $(grep '^lost' <<<"$out")"; exit 1; }
  echo "$label: $rate msg/s, connector $cpu µs CPU per message"
  LAST_CPU=$cpu
}
ratios=()
for r in $(seq "$ROUNDS"); do
  echo "== round $r"
  run plain --url amqp://127.0.0.1:5672 --address "queues/plain-$r"
  plain=$LAST_CPU
  run tls --url amqps://127.0.0.1:5671 --ca "$WORK/ca.pem" --address "queues/tls-$r"
  ratios+=("$(awk -v t="$LAST_CPU" -v p="$plain" 'BEGIN {printf "%.1f", 100 * (t / p - 1)}')")
  echo "TLS costs ${ratios[-1]} % more connector CPU per message"
done

echo "== TLS handshakes on one core (connector on core 1, openssl s_time on core 0)"
taskset -cp 1 $CONNECTOR >/dev/null
before=$(cpu_ticks $CONNECTOR)
out=$(taskset -c 0 openssl s_time -connect 127.0.0.1:5671 -new -time 10 -CAfile "$WORK/ca.pem" 2>&1)
after=$(cpu_ticks $CONNECTOR)
conns=$(sed -n 's/^\([0-9]*\) connections in .* real seconds.*/\1/p' <<<"$out" | head -1)
awk -v n="$conns" -v a="$before" -v b="$after" -v c="$CLK" \
  'BEGIN {s = (b - a) / c; printf "%d handshakes; connector CPU %.2f s: %.0f µs each, %.0f handshakes per second of one core\n", n, s, s * 1e6 / n, n / s}'
taskset -cp 0,1 $CONNECTOR >/dev/null
kill $CONNECTOR
CONNECTOR=

echo "== resident memory per idle connection"
$B/idle-rss $B/kubemq-amqp-connector 1000
$B/idle-rss $B/kubemq-amqp-connector 1000 "$WORK/server.pem" "$WORK/server.key" "$WORK/ca.pem"
