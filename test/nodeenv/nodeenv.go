// Package nodeenv runs one real Kubernetes node beside testenv's kwok nodes: containerd
// (Debian's, started without systemd with a config of its own), runc, the bridge and portmap CNI
// plugins, and a kubelet built from k8s.io/kubernetes by test/tools/build.sh, registered against
// testenv's API server. Images come from static binaries on this machine, built with
// go-containerregistry and imported with `ctr -n k8s.io images import`: there is no registry.
//
// The node needs root, cgroups, the packages of test/tools/node-packages.sh and the kubelet
// in the tools folder; Check says which of these is missing. It changes the host while it runs,
// and Stop puts it back: two addresses on lo (the node's address and the kubernetes Service's
// ClusterIP, which a forwarder in the test process serves, as kube-proxy would), a bridge for the
// pods, a loop-mounted ext4 filesystem as the kubelet's root (nodefs, so that a disk test fills
// a filesystem of its own and imagefs is a separate one), the cgroups and the kernel tunables
// the kubelet sets (vm.overcommit_memory, kernel.panic, kernel.panic_on_oops).
package nodeenv

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/reprieve-dev/reprieve/test/testenv"
)

// KubeletBin is the kubelet's name in the tools folder (test/tools/build.sh).
const KubeletBin = "kubelet"

// Addresses the node takes on lo while it runs. NodeIP is the node's InternalIP (status.hostIP
// of its pods); ServiceIP is the kubernetes Service's ClusterIP in testenv's
// --service-cluster-ip-range, which its serving certificate names. PodSubnet is the bridge's.
const (
	NodeIP    = "10.253.0.1"
	ServiceIP = "10.0.0.1"
	PodSubnet = "10.254.0.0/24"
	bridgeDev = "rpv0"
)

// PauseImage is the sandbox image the node's containerd uses, built by BuildPauseImage.
const PauseImage = "registry.k8s.io/pause:3.6"

// Check returns why this machine cannot run the node ("" when it can): not root, no cgroups,
// a missing program.
func Check() string {
	if os.Geteuid() != 0 {
		return "the real node needs root (containerd, runc, network and mount setup)"
	}
	if _, err := os.Stat("/sys/fs/cgroup/memory/memory.usage_in_bytes"); err != nil {
		if _, err2 := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err2 != nil {
			return "no cgroups at /sys/fs/cgroup (neither v1's memory controller nor v2)"
		}
	}
	for _, p := range []string{"containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "losetup", "mkfs.ext4", "ip", "mount"} {
		if _, err := exec.LookPath(p); err != nil {
			return p + " is missing: run test/tools/node-packages.sh as root (make test does)"
		}
	}
	for _, p := range []string{"/usr/lib/cni/bridge", "/usr/lib/cni/host-local", "/usr/lib/cni/portmap", "/usr/lib/cni/loopback"} {
		if _, err := os.Stat(p); err != nil {
			return p + " is missing: run test/tools/node-packages.sh as root (make test does)"
		}
	}
	bin, err := testenv.ToolsBin()
	if err != nil {
		return err.Error()
	}
	if _, err := os.Stat(filepath.Join(bin, KubeletBin)); err != nil {
		return "the kubelet is missing from " + bin + ": run `make tools` (test/tools/build.sh)"
	}
	return ""
}

// Options configure Start.
type Options struct {
	// Env is the control plane the node registers with.
	Env *testenv.Env
	// Name is the node's name.
	Name string
	// Labels are added to the node at registration (--node-labels).
	Labels map[string]string
	// NodeFsSize is the size of the kubelet's root filesystem; 0 means 4 GiB (sparse).
	NodeFsSize int64
	// ImageFsSize, when set, makes containerd's root (imagefs) a filesystem of its own of that
	// size (sparse), which images can fill; 0 leaves it on the machine's disk.
	ImageFsSize int64
	// Kubelet changes the kubelet's configuration before each start (evictionHard, ...).
	Kubelet func(*KubeletConfig)
	// Logf receives progress messages.
	Logf func(format string, args ...any)
}

// Node is a running real node.
type Node struct {
	// Name is the node's name; Dir holds its state, logs and configuration.
	Name, Dir string
	// RootDir is the kubelet's root directory (nodefs), KubeletConfigPath its config file,
	// ContainerdRoot containerd's root (imagefs), Socket containerd's socket.
	RootDir, KubeletConfigPath, ContainerdRoot, Socket string
	// LogDir holds containerd.log and kubelet.log.
	LogDir string
	// KubeletPort is the kubelet's serving port (the Summary API).
	KubeletPort int

	opts       Options
	toolsBin   string
	containerd *testenv.Process
	forwarder  net.Listener
	undo       []func() error // run in reverse order by Stop

	mu      sync.Mutex
	kubelet *testenv.Process
	config  KubeletConfig
	// imageIDs are the images ImportFiller imported, by tag, with their CRI ID.
	imageIDs map[string]string
}

// Start sets the host up, starts containerd and the kubelet, and waits until the node is
// Ready. On failure it undoes what it did.
func Start(ctx context.Context, opts Options) (_ *Node, err error) {
	if why := Check(); why != "" {
		return nil, errors.New(why)
	}
	if opts.Logf == nil {
		opts.Logf = func(string, ...any) {}
	}
	bin, _ := testenv.ToolsBin()
	dir, err := os.MkdirTemp("", "reprieve-node-")
	if err != nil {
		return nil, fmt.Errorf("creating the node's folder: %w", err)
	}
	n := &Node{Name: opts.Name, Dir: dir, opts: opts, toolsBin: bin,
		RootDir:        filepath.Join(dir, "kubelet"),
		ContainerdRoot: filepath.Join(dir, "containerd", "root"),
		Socket:         filepath.Join(dir, "containerd", "containerd.sock"),
		LogDir:         filepath.Join(dir, "logs"),
	}
	n.KubeletConfigPath = filepath.Join(n.RootDir, "config.yaml")
	defer func() {
		if err != nil {
			n.Stop()
			err = fmt.Errorf("starting the real node: %w (logs in %s)", err, n.LogDir)
		}
	}()
	begin := time.Now()
	if err := os.MkdirAll(n.LogDir, 0o755); err != nil {
		return nil, err
	}
	n.keepSysctls()
	if err := n.setupNetwork(); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	if err := n.forwardService(); err != nil {
		return nil, fmt.Errorf("forwarding the kubernetes Service: %w", err)
	}
	if err := n.mountNodeFs(ctx); err != nil {
		return nil, fmt.Errorf("nodefs: %w", err)
	}
	if err := n.mountImageFs(ctx); err != nil {
		return nil, fmt.Errorf("imagefs: %w", err)
	}
	if err := n.startContainerd(ctx); err != nil {
		return nil, fmt.Errorf("containerd: %w", err)
	}
	if err := n.importImage(ctx, PauseImage, pauseImage); err != nil {
		return nil, err
	}
	if n.KubeletPort, err = testenv.FreePort(); err != nil {
		return nil, err
	}
	n.config = defaultKubeletConfig(n)
	if opts.Kubelet != nil {
		opts.Kubelet(&n.config)
	}
	if err := n.startKubelet(ctx); err != nil {
		return nil, fmt.Errorf("kubelet: %w", err)
	}
	opts.Logf("nodeenv: node %s Ready in %s (folder %s)", n.Name, time.Since(begin).Round(time.Millisecond), n.Dir)
	return n, nil
}

// Stop deletes the node's pods (so that the kubelet tears their sandboxes and networks down),
// stops the kubelet and containerd, removes whatever containers are left, and undoes the host
// changes. The logs stay in LogDir. Safe on a nil Node and more than once.
func (n *Node) Stop() {
	if n == nil {
		return
	}
	n.mu.Lock()
	k := n.kubelet
	n.mu.Unlock()
	if k != nil && !k.Exited() && n.opts.Env != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		n.deletePods(ctx)
		cancel()
	}
	n.StopKubelet()
	if n.containerd != nil {
		n.removeContainers()
		_ = n.containerd.Stop()
		n.containerd = nil
	}
	if n.forwarder != nil {
		_ = n.forwarder.Close()
		n.forwarder = nil
	}
	for i := len(n.undo) - 1; i >= 0; i-- {
		if err := n.undo[i](); err != nil {
			n.opts.Logf("nodeenv: cleaning up: %v", err)
		}
	}
	n.undo = nil
	unmountUnder(n.Dir)
	removeKubeCgroups()
	if n.Dir != "" {
		// The logs are kept; the rest (images, snapshots, volumes) goes.
		for _, sub := range []string{"containerd", "kubelet", "nodefs.img", "imagefs.img"} {
			_ = os.RemoveAll(filepath.Join(n.Dir, sub))
		}
	}
}

// deletePods deletes every pod bound to the node with grace 0 and waits until the kubelet has
// stopped their sandboxes (none left in containerd) or ctx ends.
func (n *Node) deletePods(ctx context.Context) {
	c := n.opts.Env.Client
	pods, err := c.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + n.Name})
	if err != nil {
		return
	}
	zero := int64(0)
	for _, p := range pods.Items {
		_ = c.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero})
	}
	for ctx.Err() == nil {
		out, err := n.ctr(ctx, "tasks", "ls", "-q")
		if err == nil && len(out) == 0 {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// WaitReady waits until the node's Ready condition is True.
func (n *Node) WaitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for {
		node, err := n.opts.Env.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err == nil {
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady {
					if c.Status == corev1.ConditionTrue {
						return nil
					}
					last = c.Reason + ": " + c.Message
				}
			}
		} else {
			last = err.Error()
		}
		n.mu.Lock()
		k := n.kubelet
		n.mu.Unlock()
		if k != nil && k.Exited() {
			return fmt.Errorf("the kubelet exited (%s): %s", k.ExitDescription(), k.LogTail(20))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for node %s to be Ready: %w (last: %s)", n.Name, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
