package nodeenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/reprieve-dev/reprieve/test/testenv"
)

// containerdConfig is containerd 1.6's configuration (version 2) for the node. Two settings
// are what this machine needs beyond the paths:
//   - restrict_oom_score_adj: root here cannot lower oom_score_adj; without it every sandbox
//     fails with runc's "can't get final child's PID from pipe: EOF";
//   - SystemdCgroup = false: there is no systemd, and the kubelet uses the cgroupfs driver.
const containerdConfig = `version = 2
root = %q
state = %q
[grpc]
  address = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = %q
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = false
`

func (n *Node) startContainerd(ctx context.Context) error {
	state := filepath.Join(n.Dir, "containerd", "state")
	for _, d := range []string{n.ContainerdRoot, state} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return err
		}
	}
	cfg := filepath.Join(n.Dir, "containerd", "config.toml")
	body := fmt.Sprintf(containerdConfig, n.ContainerdRoot, state, n.Socket, PauseImage, filepath.Join(n.Dir, "cni", "net.d"))
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		return err
	}
	bin, err := exec.LookPath("containerd")
	if err != nil {
		return err
	}
	p, err := testenv.StartProcess(ctx, "containerd", filepath.Join(n.LogDir, "containerd.log"), bin, []string{"--config", cfg}, nil)
	if err != nil {
		return err
	}
	n.containerd = p
	deadline := time.Now().Add(30 * time.Second)
	for {
		if p.Exited() {
			return fmt.Errorf("containerd exited (%s): %s", p.ExitDescription(), p.LogTail(20))
		}
		if _, err := n.ctr(ctx, "version"); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("containerd did not answer within 30 s: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ctr runs ctr against the node's containerd in the CRI's namespace, k8s.io.
func (n *Node) ctr(ctx context.Context, args ...string) ([]byte, error) {
	all := append([]string{"--address", n.Socket, "--namespace", "k8s.io"}, args...)
	cmd := exec.CommandContext(ctx, "ctr", all...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return bytes.TrimSpace(out), nil
}

// removeContainers kills and removes every task and container left in containerd, so that no
// shim outlives the node.
func (n *Node) removeContainers() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := n.ctr(ctx, "tasks", "ls", "-q"); err == nil {
		for _, id := range strings.Fields(string(out)) {
			_, _ = n.ctr(ctx, "tasks", "kill", "-s", "SIGKILL", id)
		}
		for _, id := range strings.Fields(string(out)) {
			for range 20 {
				if _, err := n.ctr(ctx, "tasks", "rm", "-f", id); err == nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	if out, err := n.ctr(ctx, "containers", "ls", "-q"); err == nil {
		for _, id := range strings.Fields(string(out)) {
			_, _ = n.ctr(ctx, "containers", "rm", id)
		}
	}
}
