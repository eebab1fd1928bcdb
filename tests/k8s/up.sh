#!/usr/bin/env bash
# Starts a Kubernetes control plane on loopback from the binaries build.sh made: etcd,
# kube-apiserver (RBAC, a static admin token, service-account tokens), kube-controller-manager,
# kube-scheduler, and kwok playing the kubelet of one fake Node. Usage: up.sh BIN_DIR STATE_DIR.
# Writes STATE_DIR/admin.kubeconfig, STATE_DIR/pids and STATE_DIR/audit.log (what service
# accounts do); returns once the API server answers and the Node is Ready. down.sh STATE_DIR
# stops it all.
set -euo pipefail
BIN=$1
STATE=$2
mkdir -p "$STATE"
cd "$STATE"
# Three distinct free loopback ports, held together while they are chosen.
read -r ETCD PEER API < <(python3 -c '
import socket
held = [socket.socket() for _ in range(3)]
for s in held:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in held))')

# Certificates: a CA, the API server's serving certificate, the service-account signing key.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=kubemq-amqp-test-ca \
  -keyout ca.key -out ca.crt 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver -keyout apiserver.key \
  -out apiserver.csr 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\n' > san.ext
openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
  -extfile san.ext -out apiserver.crt 2>/dev/null
openssl genrsa -out sa.key 2048 2>/dev/null
openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
TOKEN=$(openssl rand -hex 24)
# What service accounts do is logged (the operator's tests compare it with what its RBAC grants).
cat > audit-policy.yaml <<'AUDIT'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts"]
- level: None
AUDIT
echo "$TOKEN,test-admin,test-admin,system:masters" > tokens.csv
cat > admin.kubeconfig <<KC
apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: https://127.0.0.1:$API
    certificate-authority: $STATE/ca.crt
users:
- name: admin
  user:
    token: $TOKEN
contexts:
- name: local
  context: {cluster: local, user: admin}
current-context: local
KC

: > pids
start() { # name args...
  local name=$1; shift
  "$@" > "$name.log" 2>&1 &
  echo "$! $name" >> pids
}
start etcd "$BIN/control-plane" etcd --data-dir "$STATE/etcd" --name test \
  --listen-client-urls "http://127.0.0.1:$ETCD" --advertise-client-urls "http://127.0.0.1:$ETCD" \
  --listen-peer-urls "http://127.0.0.1:$PEER" --initial-advertise-peer-urls "http://127.0.0.1:$PEER" \
  --initial-cluster "test=http://127.0.0.1:$PEER" --unsafe-no-fsync
deadline=$((SECONDS + 120))
until curl -sf "http://127.0.0.1:$ETCD/health" >/dev/null 2>&1; do
  [ $SECONDS -lt $deadline ] || { echo "etcd not healthy" >&2; tail -20 etcd.log >&2; exit 1; }
  sleep 0.2
done
start kube-apiserver "$BIN/control-plane" kube-apiserver \
  --etcd-servers "http://127.0.0.1:$ETCD" --bind-address 127.0.0.1 --advertise-address 127.0.0.1 \
  --secure-port "$API" --cert-dir "$STATE/certs" \
  --tls-cert-file apiserver.crt --tls-private-key-file apiserver.key --client-ca-file ca.crt \
  --token-auth-file tokens.csv --authorization-mode RBAC \
  --service-account-issuer https://kubernetes.default.svc.cluster.local \
  --service-account-key-file sa.pub --service-account-signing-key-file sa.key \
  --service-cluster-ip-range 10.0.0.0/24 --allow-privileged=false --profiling=false \
  --endpoint-reconciler-type none \
  --audit-policy-file audit-policy.yaml --audit-log-path "$STATE/audit.log" --audit-log-format json
until "$BIN/kubectl" --kubeconfig admin.kubeconfig get --raw /readyz >/dev/null 2>&1; do
  [ $SECONDS -lt $deadline ] || {
    echo "kube-apiserver not ready" >&2
    tail -20 kube-apiserver.log >&2
    tail -5 etcd.log >&2
    exit 1
  }
  sleep 0.5
done
start kube-controller-manager "$BIN/control-plane" kube-controller-manager \
  --kubeconfig admin.kubeconfig --authentication-kubeconfig admin.kubeconfig \
  --authorization-kubeconfig admin.kubeconfig --bind-address 127.0.0.1 --secure-port 0 \
  --leader-elect=false --use-service-account-credentials=false \
  --service-account-private-key-file sa.key --root-ca-file ca.crt \
  --cluster-name test --controllers '*'
start kube-scheduler "$BIN/control-plane" kube-scheduler \
  --kubeconfig admin.kubeconfig --authentication-kubeconfig admin.kubeconfig \
  --authorization-kubeconfig admin.kubeconfig --bind-address 127.0.0.1 --secure-port 0 \
  --leader-elect=false
start kwok "$BIN/kwok" --kubeconfig admin.kubeconfig --manage-all-nodes=false \
  --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake \
  --config "$BIN/kwok-stages.yaml" \
  --cidr 10.0.1.0/24 --node-ip 127.0.0.1 --server-address 127.0.0.1:0
"$BIN/kubectl" --kubeconfig admin.kubeconfig apply -f - >/dev/null <<'NODE'
apiVersion: v1
kind: Node
metadata:
  name: kwok-node-0
  annotations:
    node.alpha.kubernetes.io/ttl: "0"
    kwok.x-k8s.io/node: fake
  labels:
    kubernetes.io/hostname: kwok-node-0
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
status:
  allocatable: {cpu: "32", memory: 256Gi, pods: "110"}
  capacity: {cpu: "32", memory: 256Gi, pods: "110"}
NODE
"$BIN/kubectl" --kubeconfig admin.kubeconfig wait --for=condition=Ready node/kwok-node-0 --timeout=120s >/dev/null
# The default ServiceAccount of a namespace is made by the controller manager: wait for it.
until "$BIN/kubectl" --kubeconfig admin.kubeconfig -n default get serviceaccount default >/dev/null 2>&1; do
  [ $SECONDS -lt $deadline ] || { echo "no default ServiceAccount" >&2; exit 1; }
  sleep 0.5
done
echo "$STATE/admin.kubeconfig"
