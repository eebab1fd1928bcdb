//go:build tools

// kwok plays the kubelets for the operator tests: it runs fake Nodes and moves scheduled Pods to
// Running and Ready. It is built from its own module (`go build sigs.k8s.io/kwok/cmd/kwok`);
// this file keeps it in go.mod.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
