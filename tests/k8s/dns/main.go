// Cluster DNS for the real node (tests/k8s/real-node.sh), built from CoreDNS's Go module with
// only the plugins it uses: the kubernetes plugin answers for Services in cluster.local, so that
// a pod reaches a Service by name as the chart's examples address KubeMQ.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
)

// The order the plugins run in, as CoreDNS's own list has them.
func init() { dnsserver.Directives = []string{"errors", "log", "kubernetes"} }

func main() { coremain.Run() }
