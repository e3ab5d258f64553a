// pause: the sandbox container's process. Like upstream's pause.c it sleeps
// until SIGINT or SIGTERM (then exits 0) and reaps children on SIGCHLD, since
// it is PID 1 of a pod that shares its PID namespace.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		fmt.Println("pause (macvtap-rs hack/cluster)")
		return
	}
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "warning: pause should be the first process")
	}
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s == syscall.SIGCHLD {
			for {
				var ws syscall.WaitStatus
				pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
				if pid <= 0 || err != nil {
					break
				}
			}
			continue
		}
		fmt.Fprintf(os.Stderr, "shutting down, got signal: %v\n", s)
		os.Exit(0)
	}
}
