//go:build linux

package testenv

import (
	"os"
	"syscall"
)

// sysProcAttr puts the child in its own process group (so that Kill reaches anything it
// spawned) and has the kernel kill it when the test process dies, so that a crashed or
// timed-out test leaves no control plane behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup sends SIGKILL to the process group that p leads.
func killGroup(p *os.Process) {
	_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
}
