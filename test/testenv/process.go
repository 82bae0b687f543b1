package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stopGrace is how long Stop waits after SIGTERM before it sends SIGKILL.
const stopGrace = 5 * time.Second

// Process is a started helper program (for example amazon-ec2-metadata-mock, one of the
// control-plane programs, or the reprieve binary under test). Its standard output and
// standard error both go to one log file. A Process lives until Stop, Kill or its own exit;
// it is not tied to the context it was started with.
type Process struct {
	name    string
	logPath string
	cmd     *exec.Cmd

	done    chan struct{} // closed once the process has exited and been reaped
	exitErr error         // cmd.Wait's result, valid after done is closed
	stopMu  sync.Mutex    // serialises Stop
}

// StartProcess starts bin with args, writing its standard output and standard error to
// logPath (its folder is created; an existing file is appended to, so a restarted program
// keeps its earlier log). env is appended to the
// current environment (later entries win). ctx bounds only the start: once StartProcess
// returns, the process runs until Stop, Kill, or its own exit. name labels the process in
// errors.
func StartProcess(ctx context.Context, name, logPath string, bin string, args []string, env []string) (*Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, fmt.Errorf("starting %s: creating log folder: %w", name, err)
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("starting %s: opening log file: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	p := &Process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.exitErr = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// Name returns the label given to StartProcess.
func (p *Process) Name() string { return p.name }

// Pid returns the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// LogPath returns the path of the file holding the process's output.
func (p *Process) LogPath() string { return p.logPath }

// Done returns a channel that is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Signal sends sig to the process. It returns an error once the process has exited.
func (p *Process) Signal(sig os.Signal) error {
	if p.Exited() {
		return fmt.Errorf("signalling %s: %w", p.name, os.ErrProcessDone)
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signalling %s: %w", p.name, err)
	}
	return nil
}

// Kill sends SIGKILL to the process (and its process group) and waits until it has been
// reaped. Killing a process that has already exited is not an error.
func (p *Process) Kill() error {
	if p.Exited() {
		return nil
	}
	killGroup(p.cmd.Process)
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("killing %s: %w", p.name, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(stopGrace):
		return fmt.Errorf("killing %s: still running %s after SIGKILL", p.name, stopGrace)
	}
}

// Stop sends SIGTERM, waits up to 5 s for the process to exit, then sends SIGKILL. It
// returns nil once the process has exited, whatever its exit status; calling it again (or
// after the process exited on its own) is a no-op.
func (p *Process) Stop() error {
	p.stopMu.Lock()
	defer p.stopMu.Unlock()
	if p.Exited() {
		return nil
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stopping %s: %w", p.name, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(stopGrace):
	}
	if err := p.Kill(); err != nil {
		return fmt.Errorf("stopping %s after %s: %w", p.name, stopGrace, err)
	}
	return nil
}

// Wait waits up to timeout for the process to exit and returns its exit code: -1 when a
// signal ended it. It returns an error when the process is still running at the timeout.
func (p *Process) Wait(timeout time.Duration) (exitCode int, err error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		return 0, fmt.Errorf("waiting for %s to exit: still running after %s", p.name, timeout)
	}
	return p.cmd.ProcessState.ExitCode(), nil
}

// ExitDescription describes how the process ended ("exit status 1", "signal: killed"), or
// returns "running".
func (p *Process) ExitDescription() string {
	if !p.Exited() {
		return "running"
	}
	return p.cmd.ProcessState.String()
}

// LogTail returns the last n lines of the process's log file (fewer when the file is
// shorter), or a note saying why it could not be read.
func (p *Process) LogTail(n int) string {
	return logTail(p.logPath, n)
}

// maxTailBytes bounds how much of a log file logTail reads.
const maxTailBytes = 256 << 10

func logTail(path string, n int) string {
	if n <= 0 {
		return ""
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log %s: %v)", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Sprintf("(cannot read log %s: %v)", path, err)
	}
	off := max(st.Size()-maxTailBytes, 0)
	data, err := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	if err != nil {
		return fmt.Sprintf("(cannot read log %s: %v)", path, err)
	}
	data = bytes.TrimRight(data, "\n")
	lines := strings.Split(string(data), "\n")
	if off > 0 && len(lines) > 1 {
		lines = lines[1:] // the first line is probably cut
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// failure returns err extended with the tail of the process's log, for start-up errors.
func (p *Process) failure(err error) error {
	state := ""
	if p.Exited() {
		state = " (" + p.ExitDescription() + ")"
	}
	return fmt.Errorf("%w%s; last lines of %s:\n%s", err, state, p.logPath, p.LogTail(40))
}

// FreePort returns a TCP port on 127.0.0.1 that the kernel just handed out and that is
// free again (as long as nobody else grabs it first). It never returns a port it returned
// before in this process, so that tests running in parallel (t.Parallel) cannot be handed
// the same port in the moment between one's FreePort and its program's bind.
func FreePort() (int, error) {
	ports, err := freePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// handedOut are the ports freePorts returned in this process: the kernel may hand a port out
// again once its listener is closed, which is before the program it was chosen for binds it.
var handedOut = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// freePorts returns n distinct free ports on 127.0.0.1, none returned before in this process,
// holding all listeners open until every port is chosen so that the kernel cannot hand out one
// port twice.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	listeners := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range listeners {
			_ = l.Close()
		}
	}()
	handedOut.Lock()
	defer handedOut.Unlock()
	// A port handed out before is kept listening (so that the kernel picks another) and
	// skipped; the bound keeps a full port range from looping forever.
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			return nil, fmt.Errorf("getting a free port: %d tries gave only ports handed out before", tries)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("getting a free port: %w", err)
		}
		listeners = append(listeners, l)
		port := l.Addr().(*net.TCPAddr).Port
		if handedOut.ports[port] {
			continue
		}
		handedOut.ports[port] = true
		ports = append(ports, port)
	}
	return ports, nil
}
