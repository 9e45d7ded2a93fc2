// Command pause is the pod sandbox's process: it holds the pod's namespaces and does nothing
// else. It exits on SIGTERM or SIGINT and reaps any child re-parented to it.
//
// The upstream pause image is pulled from a registry; this one builds from the Go toolchain
// alone (hack/images/build.sh), so nodes without a registry can run pods.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig == syscall.SIGCHLD {
			for {
				var status syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		os.Exit(0)
	}
}
