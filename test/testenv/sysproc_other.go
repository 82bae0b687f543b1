//go:build !linux

package testenv

import (
	"os"
	"syscall"
)

// sysProcAttr returns nil: process groups and parent-death signals are Linux-only here.
func sysProcAttr() *syscall.SysProcAttr { return nil }

// killGroup does nothing outside Linux; Kill still kills the process itself.
func killGroup(*os.Process) {}
