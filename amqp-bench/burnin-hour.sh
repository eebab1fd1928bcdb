#!/usr/bin/env bash
# The long burn-in runs of RELIABILITY.md: KubeMQ's own burn-in harness for its AMQP 1.0
# connector, unchanged, against this connector for LENGTH (default 60m) with a fault every
# EVERY (default 10m). Runs the binaries named by BURNIN_BINARY and KUBEMQ_BINARY (else those in
# $HOME/.cache/kubemq-amqp/; this script never builds them), all in a network namespace with
# nothing but loopback (root and unshare needed). Not part of CI.
#
#   bash amqp-bench/burnin-hour.sh embedded kill-connector   # embedded store, SIGKILL the connector
#   bash amqp-bench/burnin-hour.sh kubemq kill-connector     # real KubeMQ, SIGKILL the connector
#   bash amqp-bench/burnin-hour.sh kubemq restart-kubemq     # real KubeMQ, stopped and started
#
# Prints the harness's verdict and report, and the connector's own counters before each fault
# and at the end. Everything the run wrote stays in the folder it names.
set -euo pipefail
cd "$(dirname "$0")/.."
BACKEND=${1:?usage: $0 embedded|kubemq kill-connector|restart-kubemq|none}
FAULT=${2:?usage: $0 embedded|kubemq kill-connector|restart-kubemq|none}
LENGTH=${LENGTH:-60m}
EVERY=${EVERY:-600}
CACHE=$HOME/.cache/kubemq-amqp
BURNIN=${BURNIN_BINARY:-$CACHE/burnin}
KUBEMQ=${KUBEMQ_BINARY:-$CACHE/kubemq-community}
[ -x "$BURNIN" ] || { echo "no burn-in harness at $BURNIN" >&2; exit 2; }
if [ "$BACKEND" = kubemq ] && [ ! -x "$KUBEMQ" ]; then echo "no KubeMQ at $KUBEMQ" >&2; exit 2; fi
if [ "$FAULT" = restart-kubemq ] && [ "$BACKEND" != kubemq ]; then
  echo "restart-kubemq needs the kubemq backend" >&2; exit 2
fi
if [ -z "${IN_NETNS:-}" ]; then
  cargo build --release --quiet -p kubemq-amqp-connector
  RUN=$(mktemp -d /tmp/burnin-hour.XXXXXX)
  # A copy, so that a rebuild during the hour does not change the connector a restart runs.
  cp target/release/kubemq-amqp-connector "$RUN/"
  exec unshare --net -- env IN_NETNS=1 RUN="$RUN" \
    bash -c 'ip link set lo up && exec bash "$0" "$@"' "$0" "$@"
fi
trap 'kill ${BURNIN_PID:-} ${CONNECTOR_PID:-} ${KUBEMQ_PID:-} 2>/dev/null; wait 2>/dev/null' EXIT
echo "run folder: $RUN ($BACKEND backend, fault $FAULT every ${EVERY}s, $LENGTH)"
wait_port() { until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do sleep 0.1; done; }

start_kubemq() {
  mkdir -p "$RUN/kubemq"
  (cd "$RUN/kubemq" && GRPC_PORT=50000 REST_PORT=9090 API_PORT=8081 STORE_STORE_PATH=./store \
    HTTPS_PROXY=http://127.0.0.1:9 HTTP_PROXY=http://127.0.0.1:9 \
    exec env -u KUBERNETES_SERVICE_HOST "$KUBEMQ" server >>kubemq.log 2>&1) &
  KUBEMQ_PID=$!
  wait_port 50000
}
start_connector() {
  local backend=(--data-dir "$RUN/store")
  [ "$BACKEND" = kubemq ] && backend=(--kubemq-address 127.0.0.1:50000)
  "$RUN/kubemq-amqp-connector" "${backend[@]}" --port 5672 --http-address 127.0.0.1:8080 \
    >>"$RUN/connector.log" 2>&1 &
  CONNECTOR_PID=$!
  wait_port 5672
}
counters() { # label
  echo "--- connector counters, $1"
  (exec 3<>/dev/tcp/127.0.0.1/8080 && printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3 && cat <&3) \
    2>/dev/null | grep -E '^kubemq_amqp10_(transfers|dispositions|errors|rpc|events)' \
    | grep -v ' 0$' || echo "(not reachable)"
}

[ "$BACKEND" = kubemq ] && start_kubemq
start_connector
python3 - "$CACHE/burnin-config-run.yaml" "$RUN" "$LENGTH" <<'EOF'
import sys, yaml
template, run, length = sys.argv[1:]
config = yaml.safe_load(open(template))
config["duration"] = length
config["output"]["report_file"] = f"{run}/report.json"
yaml.safe_dump(config, open(f"{run}/burnin-config.yaml", "w"))
EOF
KUBEMQ_BROKER_ADDRESS=127.0.0.1:5672 "$BURNIN" -run -config "$RUN/burnin-config.yaml" \
  >"$RUN/burnin.out" 2>"$RUN/burnin.err" &
BURNIN_PID=$!

case "$LENGTH" in
  *h) length_s=$(( ${LENGTH%h} * 3600 )) ;;
  *m) length_s=$(( ${LENGTH%m} * 60 )) ;;
  *s) length_s=${LENGTH%s} ;;
  *) length_s=$LENGTH ;;
esac
next=$EVERY
start=$SECONDS
while kill -0 "$BURNIN_PID" 2>/dev/null; do
  sleep 5
  # Faults within the run only, none as it ends.
  if [ "$FAULT" != none ] && (( SECONDS - start >= next && next < length_s )); then
    next=$((next + EVERY))
    counters "before the fault at $((SECONDS - start)) s"
    case "$FAULT" in
    kill-connector)
      kill -KILL "$CONNECTOR_PID"; wait "$CONNECTOR_PID" 2>/dev/null || true
      echo "$(date -u +%T) connector killed with SIGKILL"
      start_connector
      ;;
    restart-kubemq)
      kill -TERM "$KUBEMQ_PID"; wait "$KUBEMQ_PID" 2>/dev/null || true
      echo "$(date -u +%T) KubeMQ stopped"
      sleep 5
      start_kubemq
      echo "$(date -u +%T) KubeMQ started"
      ;;
    esac
  fi
done
wait "$BURNIN_PID" || true
counters "at the end"
echo "--- verdict"
grep -h 'burn-in verdict' "$RUN/burnin.err" "$RUN/burnin.out" || echo "no verdict"
echo "--- report"
tail -n 80 "$RUN/burnin.out"
