// One binary for the control plane the operator tests run against, built from the components'
// own Go modules: the first argument names the component, the rest are its flags. Called
// through a link named kubectl, it is kubectl of the same release.
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"
	"go.etcd.io/etcd/server/v3/etcdmain"
	"k8s.io/component-base/cli"
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	if filepath.Base(os.Args[0]) == "kubectl" {
		command := kubectl.NewDefaultKubectlCommand()
		if err := cli.RunNoErrOutput(command); err != nil {
			kubectlutil.CheckErr(err)
		}
		return
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: control-plane etcd|kube-apiserver|kube-controller-manager|kube-scheduler [flags], or as kubectl")
		os.Exit(2)
	}
	component, args := os.Args[1], os.Args[2:]
	switch component {
	case "etcd":
		etcdmain.Main(append([]string{"etcd"}, args...))
	case "kube-apiserver":
		run(apiserver.NewAPIServerCommand(), args)
	case "kube-controller-manager":
		run(controllermanager.NewControllerManagerCommand(), args)
	case "kube-scheduler":
		run(scheduler.NewSchedulerCommand(), args)
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
