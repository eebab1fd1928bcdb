// One binary for a real node of the control plane the operator tests run against, built from
// the components' own Go modules: the first argument names the component (kubelet or
// kube-proxy), the rest are its flags. The container runtime is Debian's containerd and runc.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	proxy "k8s.io/kubernetes/cmd/kube-proxy/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: node kubelet|kube-proxy [flags]")
		os.Exit(2)
	}
	component, args := os.Args[1], os.Args[2:]
	switch component {
	case "kubelet":
		run(kubelet.NewKubeletCommand(), args)
	case "kube-proxy":
		run(proxy.NewProxyCommand(), args)
	default:
		fmt.Fprintf(os.Stderr, "unknown component %q\n", component)
		os.Exit(2)
	}
}

// run executes a component's cobra command with args and exits with its status.
func run(cmd *cobra.Command, args []string) {
	cmd.SetArgs(args)
	os.Exit(cli.Run(cmd))
}
