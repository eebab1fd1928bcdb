#!/usr/bin/env bash
# Builds a control plane the operator tests run against from the components' Go modules, with
# this machine's Go: one binary for etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler and (through a link of that name) kubectl of one Kubernetes release; and kwok,
# which plays the kubelets. Usage: build.sh [MINOR], MINOR being 1.30 (v1.30.14, the chart's
# kubeVersion floor; the default) or 1.37 (v1.37.2, the newest minor the Go module proxy serves).
# Cached by version and by the hash of the Go files that make it, so a second run builds
# nothing. Prints the folder of the binaries.
set -euo pipefail
cd "$(dirname "$0")"
case "${1:-1.30}" in
  1.30) K8S=v1.30.14 MODFILE=go.mod ;;
  1.37) K8S=v1.37.2 MODFILE=go.v1.37.mod ;;
  *) echo "build.sh: no control plane for Kubernetes ${1:-}" >&2; exit 2 ;;
esac
TOOLS="${KUBEMQ_AMQP_TOOLS:-$HOME/.cache/kubemq-amqp-tools}"
KEY=$(cat "$MODFILE" "${MODFILE%.mod}.sum" main.go kwok/go.mod kwok/go.sum | sha256sum | cut -c1-12)
OUT="$TOOLS/k8s-$K8S-$KEY"
if [ ! -x "$OUT/kwok" ]; then
  echo "== building the Kubernetes $K8S control plane and kwok (once; cached in $OUT)" >&2
  rm -rf "$OUT.tmp" && mkdir -p "$OUT.tmp"
  . ./ldflags.sh
  go build -mod=readonly -modfile "$MODFILE" -trimpath -ldflags "$(k8s_ldflags "$K8S")" -o "$OUT.tmp/control-plane" .
  ln -s control-plane "$OUT.tmp/kubectl"
  (cd kwok && go build -mod=readonly -trimpath -ldflags "-s -w" -o "$OUT.tmp/kwok" sigs.k8s.io/kwok/cmd/kwok)
  # kwok's own stages, from its module: Nodes become Ready and keep a heartbeat, scheduled Pods
  # become Running and Ready, deleted Pods go. Pods whose first container runs the image
  # never-ready.invalid/connector:0 are never made Ready, which is how the tests hold a rollout.
  stages=$(cd kwok && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage
  for f in node/fast/node-initialize.yaml node/heartbeat/node-heartbeat.yaml \
    pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
    echo "---"
    if [ "$f" = pod/fast/pod-ready.yaml ]; then
      python3 - "$stages/$f" <<'PY'
import sys
text = open(sys.argv[1]).read()
hold = """    matchExpressions:
    - key: '.spec.containers.[0].image'
      operator: 'NotIn'
      values:
      - 'never-ready.invalid/connector:0'
"""
assert text.count("    matchExpressions:\n") == 1, "pod-ready stage changed shape"
print(text.replace("    matchExpressions:\n", hold, 1), end="")
PY
    else
      cat "$stages/$f"
    fi
  done > "$OUT.tmp/kwok-stages.yaml"
  rm -rf "$OUT" && mv "$OUT.tmp" "$OUT"
fi
echo "$OUT"
