# The linker flags that stamp a Kubernetes release's own version into a binary built from its Go
# modules, as the release's build would: kubectl, helm and the chart's kubeVersion check read it.
# Sourced by build.sh and build-node.sh. Usage: k8s_ldflags v1.30.14
k8s_ldflags() {
  local version=$1 minor=${1#v1.} ld="-s -w" p
  minor=${minor%%.*}
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $p.gitVersion=$version -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean"
  done
  echo "$ld"
}
