#!/usr/bin/env bash
# Builds what a real node of the v1.30 control plane runs besides Debian's containerd, runc and
# CNI plugins (tests/run.sh installs those): kubelet and kube-proxy from their Go module, as one
# binary (tests/k8s/node), the cluster's DNS server from CoreDNS's Go module (tests/k8s/dns), and
# the pod sandbox's pause image from Kubernetes' pause.c (static, with gcc), as an OCI image
# layout (umoci). Cached by version and by the hash of the files that make it. Prints the folder.
set -euo pipefail
cd "$(dirname "$0")/node"
K8S=v1.30.14
TOOLS="${KUBEMQ_AMQP_TOOLS:-$HOME/.cache/kubemq-amqp-tools}"
KEY=$(cat go.mod go.sum main.go ../dns/go.mod ../dns/go.sum ../dns/main.go | sha256sum | cut -c1-12)
OUT="$TOOLS/k8s-node-$K8S-$KEY"
if [ ! -x "$OUT/node" ]; then
  command -v umoci >/dev/null || { echo "build-node.sh needs umoci (tests/run.sh installs it)" >&2; exit 1; }
  echo "== building kubelet, kube-proxy $K8S, CoreDNS and the pause image (once; cached in $OUT)" >&2
  rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp"
  . ../ldflags.sh
  go build -mod=readonly -trimpath -ldflags "$(k8s_ldflags "$K8S")" -o "$OUT.tmp/node" .
  (cd ../dns && CGO_ENABLED=0 go build -mod=readonly -trimpath -ldflags "-s -w" -o "$OUT.tmp/coredns" .)
  src=$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c
  work=$(mktemp -d)
  gcc -Os -static -DVERSION=v3.9 -o "$work/pause" "$src"
  umoci init --layout "$OUT.tmp/pause"
  umoci new --image "$OUT.tmp/pause:3.9"
  umoci unpack --image "$OUT.tmp/pause:3.9" "$work/bundle" >/dev/null
  install -m 0755 "$work/pause" "$work/bundle/rootfs/pause"
  umoci repack --image "$OUT.tmp/pause:3.9" "$work/bundle"
  umoci config --image "$OUT.tmp/pause:3.9" --config.entrypoint /pause --config.user 65535:65535
  umoci gc --layout "$OUT.tmp/pause"
  rm -rf "$work"
  rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
fi
echo "$OUT"
