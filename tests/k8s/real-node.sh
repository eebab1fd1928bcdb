#!/usr/bin/env bash
# The chart's connector pods on a real node: the v1.30 control plane (up.sh), a kubelet with
# Debian's containerd and runc, the CNI bridge and host-local plugins and kube-proxy (iptables),
# the project's images imported from their OCI layouts (no registry), the chart installed with
# helm, CoreDNS answering for the cluster's Services, examples/amqpconnector.yaml applied as
# written, and python-qpid-proton (tests/python/real_node.py) sending and receiving through its
# Service's ClusterIP and NodePort; then kubectl scale to 3 and back, KubeMQ stopped (the pods
# leave the Service by their readiness probe) and started again, a rolling update under a
# producer (no accepted message lost; a consumer on a replaced pod closed with
# amqp:connection:forced, its delivery back) and a pod's connector killed with SIGKILL
# (restarted, nothing lost). KubeMQ runs beside the node on the node's address, behind the Service the
# example names (kubemq-cluster-grpc.kubemq): the real KubeMQ when its binary is given, else the
# embedded store's gRPC façade.
# Run by operator/tests/real_node.rs in a network and mount namespace of its own:
#   unshare --net --mount --propagation private bash real-node.sh CP NODE IMAGES CONNECTOR OPERATOR HELM STATE [KUBEMQ]
# CP: build.sh 1.30's folder; NODE: build-node.sh's folder; IMAGES: images/build.sh's folder;
# CONNECTOR, OPERATOR: the binaries (the façade, and the operator run as the chart's pod would);
# HELM: helm 3; STATE: a folder for everything it writes; KUBEMQ: the real KubeMQ's binary.
# Prints `PASS <step>` per step.
set -euo pipefail
CP=$(realpath "$1") NODE=$(realpath "$2") IMAGES=$(realpath "$3") CONNECTOR=$(realpath "$4")
OPERATOR=$(realpath "$5") HELM=$(realpath "$6") STATE=$(realpath -m "$7") KUBEMQ=${8:-}
REPO=$(cd "$(dirname "$0")/../.." && pwd)
NODE_IP=10.22.0.1
POD_CIDR=10.22.0.0/24
mkdir -p "$STATE"
cd "$STATE"
pids=()
# Everything started here ends with the script: the pods' containers (runc's own state), the
# processes it spawned, the control plane; the mounts go with the mount namespace.
cleanup() {
  local id p
  # The kubelet first, so that it restarts no container while they are removed.
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 2
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for id in $(runc --root "$STATE/runc/k8s.io" list -q 2>/dev/null); do
    runc --root "$STATE/runc/k8s.io" delete --force "$id" >/dev/null 2>&1 || true
  done
  pkill -f "containerd-shim-runc-v2 .*-address $STATE/" 2>/dev/null || true
  bash "$REPO/tests/k8s/down.sh" "$STATE/cp" >/dev/null 2>&1 || true
}
trap cleanup EXIT
spawn() { # name args...
  local name=$1; shift
  "$@" > "$STATE/$name.log" 2>&1 &
  pids+=($!)
}
wait_for() { # what seconds command...
  local what=$1 limit=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    if [ $SECONDS -ge $deadline ]; then
      echo "never happened: $what" >&2
      for f in "$STATE"/*.log; do echo "--- $f" >&2; tail -15 "$f" >&2; done
      exit 1
    fi
    sleep 1
  done
}

# The node's address is the pods' gateway: the bridge the CNI plugin attaches pods to, made here
# with its address so that the kubelet, CoreDNS and KubeMQ can bind to it before the first pod.
ip link set lo up
# KubeMQ's gRPC port is in the ephemeral range: kept out of it, so that no outgoing connection
# of the node's components holds it when KubeMQ binds it.
echo 50000 > /proc/sys/net/ipv4/ip_local_reserved_ports
ip link add kmqa-br0 type bridge
ip addr add "$NODE_IP/24" dev kmqa-br0
ip link set kmqa-br0 up
# Service addresses (up.sh's service range) are routed towards the pods, where kube-proxy's rules
# translate them; without a route, a client here would find them unreachable before any rule.
ip route add 10.0.0.0/24 dev kmqa-br0

KUBECONFIG=$(bash "$REPO/tests/k8s/up.sh" "$CP" "$STATE/cp")
export KUBECONFIG
kubectl() { "$CP/kubectl" "$@"; }

# containerd: its own root, state and socket; the pause image built from Kubernetes' pause.c;
# pods may not lower their OOM score below containerd's own (this machine forbids it).
mkdir -p containerd cni/net.d
cat > containerd/config.toml <<EOF
version = 2
root = "$STATE/containerd/root"
state = "$STATE/containerd/state"
[grpc]
  address = "$STATE/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.9"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "$STATE/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
EOF
cat > cni/net.d/10-bridge.conflist <<EOF
{"cniVersion": "0.4.0", "name": "kmqa", "plugins": [
  {"type": "bridge", "bridge": "kmqa-br0", "isGateway": true, "ipMasq": false,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$STATE/cni/ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}},
  {"type": "loopback"}]}
EOF
spawn containerd containerd --config "$STATE/containerd/config.toml"
ctr() { command ctr --address "$STATE/containerd/containerd.sock" -n k8s.io "$@"; }
wait_for "containerd answers" 30 ctr version
# Each layout's one manifest carries its tag as org.opencontainers.image.ref.name, so
# --base-name names it NAME:TAG. No --index-name: with the same name ctr would record the index
# and then the manifest under it, leaving the index unreferenced when ctr's lease ends, and its
# unpack of the index races containerd's garbage collector ("content digest ...: not found").
import() { # layout tag name
  (cd "$1" && tar cf "$STATE/image.tar" .)
  ctr images import --base-name "$3" "$STATE/image.tar" >/dev/null
  ctr images ls -q | grep -x "$3:$2" >/dev/null || { echo "not imported: $3:$2" >&2; exit 1; }
}
import "$NODE/pause" 3.9 registry.k8s.io/pause
VERSION=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"])' "$IMAGES/kubemq-amqp-connector/index.json")
import "$IMAGES/kubemq-amqp-connector" "$VERSION" ghcr.io/kubemq-io/kubemq-amqp-connector
import "$IMAGES/kubemq-amqp-operator" "$VERSION" ghcr.io/kubemq-io/kubemq-amqp-operator
echo "PASS images imported from their OCI layouts"

cat > kubelet.yaml <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication: {anonymous: {enabled: false}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
address: 127.0.0.1
readOnlyPort: 0
healthzPort: 0
clusterDomain: cluster.local
clusterDNS: [$NODE_IP]
resolvConf: /etc/resolv.conf
containerRuntimeEndpoint: unix://$STATE/containerd/containerd.sock
evictionHard: {}
localStorageCapacityIsolation: false
EOF
spawn kubelet "$NODE/node" kubelet --config kubelet.yaml --kubeconfig "$KUBECONFIG" \
  --root-dir "$STATE/kubelet" --hostname-override real-node-0 --node-ip "$NODE_IP"
wait_for "the real node is Ready" 120 kubectl wait --for=condition=Ready node/real-node-0 --timeout=1s
spawn kube-proxy "$NODE/node" kube-proxy --kubeconfig "$KUBECONFIG" --hostname-override real-node-0 \
  --proxy-mode iptables --cluster-cidr "$POD_CIDR" --bind-address "$NODE_IP" --conntrack-max-per-core 0 \
  --metrics-bind-address 127.0.0.1:10249 --healthz-bind-address 127.0.0.1:10256
echo "PASS a kubelet with containerd and runc is Ready"

# The cluster's DNS: CoreDNS on the node's address, which the kubelet gives the pods.
cat > Corefile <<EOF
.:53 {
  errors
  log
  kubernetes cluster.local {
    kubeconfig $KUBECONFIG
  }
}
EOF
spawn coredns "$NODE/coredns" -conf "$STATE/Corefile"
wait_for "CoreDNS listens" 30 bash -c "echo > /dev/tcp/$NODE_IP/53"
echo "PASS CoreDNS answers for the cluster's Services"

# KubeMQ on the node's address, and the Service the example names pointing there (a Service
# without selector, its EndpointSlice written here).
start_kubemq() { # what it stored before is kept
  if [ -n "$KUBEMQ" ]; then
    # KubeMQ binds every interface: here those of this namespace only, which has no route out;
    # its usage report also goes to a closed port as its proxy.
    mkdir -p kubemq
    (cd kubemq && exec env -u KUBERNETES_SERVICE_HOST -u NO_PROXY -u no_proxy GRPC_PORT=50000 \
      REST_PORT=9091 API_PORT=8081 STORE_STORE_PATH=./store \
      HTTPS_PROXY=http://127.0.0.1:9 HTTP_PROXY=http://127.0.0.1:9 \
      "$KUBEMQ" server >> "$STATE/kubemq.log" 2>&1) &
  else
    "$CONNECTOR" --bind-address 127.0.0.1 --port 5673 --http-address 127.0.0.1:0 \
      --serve-kubemq-grpc "$NODE_IP:50000" --data-dir "$STATE/facade" >> "$STATE/facade.log" 2>&1 &
  fi
  kubemq_pid=$!
  pids+=($kubemq_pid)
  wait_for "KubeMQ listens" 60 bash -c "echo > /dev/tcp/$NODE_IP/50000"
}
stop_kubemq() {
  kill "$kubemq_pid"
  wait "$kubemq_pid" 2>/dev/null || true
}
if [ -n "$KUBEMQ" ]; then backend="the real KubeMQ"; else backend="the embedded store's gRPC façade"; fi
start_kubemq
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata: {name: kubemq}
---
apiVersion: v1
kind: Service
metadata: {name: kubemq-cluster-grpc, namespace: kubemq}
spec:
  ports: [{name: grpc, port: 50000, protocol: TCP}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubemq-cluster-grpc-node
  namespace: kubemq
  labels: {kubernetes.io/service-name: kubemq-cluster-grpc}
addressType: IPv4
ports: [{name: grpc, port: 50000, protocol: TCP}]
endpoints: [{addresses: ["$NODE_IP"]}]
EOF
echo "PASS KubeMQ ($backend) serves behind kubemq-cluster-grpc.kubemq"

# The chart; its operator pod goes to the simulated node (it could not reach the API server on
# loopback from a pod), and runs here as that pod would, under its ServiceAccount's token.
"$HELM" install aco "$REPO/helm/amqp-connector-operator" -n operators --create-namespace \
  --set-string 'nodeSelector.type=kwok' --wait --timeout 120s >/dev/null
token=$(kubectl -n operators create token aco --duration=1h)
sed "s/^    token: .*/    token: $token/" "$KUBECONFIG" > operator.kubeconfig
KUBECONFIG="$STATE/operator.kubeconfig" POD_NAME=aco-0 POD_NAMESPACE=operators \
  spawn operator "$OPERATOR" --http-address=127.0.0.1:0 --leader-election=false
# Nothing more goes to the simulated node: the example's pods land on the real one.
kubectl cordon kwok-node-0 >/dev/null
echo "PASS the chart installed with helm"

kubectl apply -f "$REPO/examples/amqpconnector.yaml" >/dev/null
# A NodePort too, for a client that is not routed to ClusterIPs (the pods are not re-made).
kubectl -n apps patch amqpc orders --type=merge -p '{"spec":{"service":{"type":"NodePort"}}}' >/dev/null
pods_ready() { # count: exactly that many pods of orders, all on the real node and ready
  local ready
  ready=$(kubectl -n apps get pods -l app.kubernetes.io/instance=orders \
    -o jsonpath='{range .items[*]}{.spec.nodeName} {.status.containerStatuses[0].ready}{"\n"}{end}')
  [ "$(echo "$ready" | grep -c '^real-node-0 true$')" = "$1" ] && [ "$(echo "$ready" | grep -c .)" = "$1" ]
}
rolled() { # the Deployment made a second ReplicaSet (a new pod template)
  [ "$(kubectl -n apps get replicasets -l app.kubernetes.io/instance=orders -o name | wc -l)" -ge 2 ]
}
client() { python3 "$REPO/tests/python/real_node.py" "$@"; }
wait_for "the AmqpConnector is Ready on the real node" 180 \
  kubectl -n apps wait --for=condition=Ready amqpc/orders --timeout=1s
pods_ready 2 || { kubectl -n apps get pods -o wide >&2; exit 1; }
echo "PASS two connector pods run and are ready on the real node"

cluster_ip=$(kubectl -n apps get service orders -o jsonpath='{.spec.clusterIP}')
node_port=$(kubectl -n apps get service orders -o jsonpath='{.spec.ports[?(@.name=="amqp")].nodePort}')
SERVICE="amqp://$cluster_ip:5672"
wait_for "kube-proxy routes the ClusterIP" 60 bash -c "echo > /dev/tcp/$cluster_ip/5672"
client roundtrip "$SERVICE" queues/real-node
echo "PASS a client sends and receives through the Service's ClusterIP"
client roundtrip "amqp://$NODE_IP:$node_port" queues/real-node-port
echo "PASS a client sends and receives through the NodePort"

kubectl -n apps scale amqpc/orders --replicas=3 >/dev/null
wait_for "three pods ready" 120 pods_ready 3
client roundtrip "$SERVICE" queues/scaled-up
kubectl -n apps scale amqpc/orders --replicas=2 >/dev/null
wait_for "two pods ready" 120 pods_ready 2
client roundtrip "$SERVICE" queues/scaled-down
echo "PASS kubectl scale to 3 and back to 2 keeps serving"

# Readiness follows KubeMQ: without it the pods are taken out of the Service (their readiness
# probe fails) and stay running; back, they serve again with what was stored before.
client send "$SERVICE" queues/outage 5 > before-outage.txt
stop_kubemq
none_ready() {
  [ "$(kubectl -n apps get endpointslices -l kubernetes.io/service-name=orders \
    -o jsonpath='{range .items[*].endpoints[*]}{.conditions.ready}{"\n"}{end}' | grep -c '^true$')" = 0 ] &&
    [ "$(kubectl -n apps get pods -l app.kubernetes.io/instance=orders \
      -o jsonpath='{range .items[*]}{.status.containerStatuses[0].ready} {.status.containerStatuses[0].restartCount}{"\n"}{end}')" \
      = "$(printf 'false 0\nfalse 0')" ]
}
wait_for "both pods unready, not restarted, out of the Service without KubeMQ" 60 none_ready
start_kubemq
wait_for "two pods ready with KubeMQ back" 120 pods_ready 2
client drain "$SERVICE" queues/outage 5 > after-outage.txt
[ -z "$(comm -23 <(sort before-outage.txt) <(sort -u after-outage.txt))" ] || { echo "lost in the outage" >&2; exit 1; }
echo "PASS readiness follows KubeMQ: the pods leave the Service without it and serve again"

# A rolling update (a tunable changed) while a producer sends: every message the connector
# accepted is there afterwards; a consumer holding an unsettled delivery on an old pod is closed
# with amqp:connection:forced within the pod's termination grace, and the delivery is back.
client send "$SERVICE" queues/held 1 > held-sent.txt
# (bounded: a connection the connector never ended would otherwise hold the script)
timeout 300 python3 "$REPO/tests/python/real_node.py" hold "$SERVICE" queues/held > held.txt &
holder=$!
wait_for "the consumer holds its delivery" 60 grep -q '^holding k-1$' held.txt
client produce "$SERVICE" queues/rolling "$STATE/stop-producing" > accepted.txt &
producer=$!
sleep 3
kubectl -n apps patch amqpc orders --type=merge -p '{"spec":{"amqp":{"getBatchSize":64}}}' >/dev/null
wait_for "the Deployment rolls to the new template" 60 rolled
kubectl -n apps rollout status deployment/orders --timeout=180s >/dev/null
wait_for "two pods ready after the rollout" 120 pods_ready 2
sleep 3
touch "$STATE/stop-producing"
wait "$producer"
sent=$(sort -u accepted.txt | wc -l)
client drain "$SERVICE" queues/rolling "$sent" > received.txt
missing=$(comm -23 <(sort -u accepted.txt) <(sort -u received.txt) | wc -l)
[ "$sent" -gt 0 ] && [ "$missing" = 0 ] || { echo "accepted $sent, missing $missing" >&2; exit 1; }
echo "PASS a rolling update loses none of the $sent accepted messages"
wait "$holder"
[ "$(tail -1 held.txt)" = "amqp:connection:forced" ] || { echo "the holder saw: $(cat held.txt)" >&2; exit 1; }
client drain "$SERVICE" queues/held 1 > held-back.txt
[ "$(cat held-back.txt)" = "k-1" ] || { echo "the held delivery came back as: $(cat held-back.txt)" >&2; exit 1; }
echo "PASS a consumer on a replaced pod is closed with amqp:connection:forced and its delivery is back"

# One pod's connector process killed with SIGKILL: the kubelet restarts it, and what was accepted
# before is still there.
client send "$SERVICE" queues/killed 20 > before-kill.txt
pod=$(kubectl -n apps get pods -l app.kubernetes.io/instance=orders -o jsonpath='{.items[0].metadata.name}')
container=$(kubectl -n apps get pod "$pod" -o jsonpath='{.status.containerStatuses[0].containerID}')
pid=$(runc --root "$STATE/runc/k8s.io" state "${container#containerd://}" | python3 -c 'import json,sys; print(json.load(sys.stdin)["pid"])')
kill -9 "$pid"
restarted() {
  [ "$(kubectl -n apps get pod "$pod" -o jsonpath='{.status.containerStatuses[0].restartCount}')" -ge 1 ] &&
    pods_ready 2
}
wait_for "the killed pod comes back" 120 restarted
client drain "$SERVICE" queues/killed 20 > after-kill.txt
[ -z "$(comm -23 <(sort before-kill.txt) <(sort -u after-kill.txt))" ] || { echo "lost after SIGKILL" >&2; exit 1; }
echo "PASS a pod killed with SIGKILL comes back and nothing accepted is lost"
