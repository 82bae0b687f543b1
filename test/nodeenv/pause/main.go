// Command pause is the real node's sandbox process, in the role of registry.k8s.io/pause: it
// holds a pod's namespaces and waits until the runtime stops it. As PID 1 it gets no default
// signal handling, so it exits on SIGTERM and SIGINT itself, and it reaps the zombies a shared
// process namespace may hand it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 8)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
