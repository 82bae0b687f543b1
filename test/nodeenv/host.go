package nodeenv

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// run runs a host command and returns its error with its output.
func run(ctx context.Context, name string, args ...string) error {
	out, err := exec.CommandContext(ctx, name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setupNetwork puts NodeIP and ServiceIP on lo and writes the CNI configuration: a bridge with
// host-local addresses from PodSubnet (the host is the pods' gateway, so they reach NodeIP and
// ServiceIP) and portmap for hostPorts. No masquerading, by the bridge or by portmap (whose
// "snat" would masquerade a pod's connection to a hostPort from the bridge's address): the
// notice endpoint knows a pod by its source address, as on CNIs that keep it (the kernel's
// bridge netfilter, on here, lets conntrack undo the DNAT of the replies).
func (n *Node) setupNetwork() error {
	ctx := context.Background()
	for _, ip := range []string{NodeIP, ServiceIP} {
		if err := run(ctx, "ip", "addr", "add", ip+"/32", "dev", "lo"); err != nil {
			return err
		}
		n.undo = append(n.undo, func() error { return run(context.Background(), "ip", "addr", "del", ip+"/32", "dev", "lo") })
	}
	// The hostPort rules of sandboxes that were never torn down (a run that was killed) would
	// send the port to an address that is now another pod's.
	removeHostPortRules()
	n.undo = append(n.undo, func() error { removeHostPortRules(); return nil })
	n.undo = append(n.undo, func() error {
		if _, err := net.InterfaceByName(bridgeDev); err != nil {
			return nil
		}
		return run(context.Background(), "ip", "link", "del", bridgeDev)
	})
	conf := fmt.Sprintf(`{
  "cniVersion": "0.4.0",
  "name": "reprieve-node",
  "plugins": [
    {"type": "bridge", "bridge": %q, "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}],
              "dataDir": %q}},
    {"type": "portmap", "capabilities": {"portMappings": true}, "snat": false}
  ]
}
`, bridgeDev, PodSubnet, filepath.Join(n.Dir, "cni", "ipam"))
	confDir := filepath.Join(n.Dir, "cni", "net.d")
	if err := os.MkdirAll(confDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(confDir, "10-reprieve-node.conflist"), []byte(conf), 0o644)
}

// forwardService serves ServiceIP:443 by forwarding each connection to the API server on
// loopback, as kube-proxy would route the kubernetes Service: in-cluster clients on the node
// (KUBERNETES_SERVICE_HOST, set by the kubelet) reach the API server and verify its
// certificate, which names ServiceIP.
func (n *Node) forwardService() error {
	u, err := url.Parse(n.opts.Env.Host)
	if err != nil {
		return err
	}
	l, err := Forward(net.JoinHostPort(ServiceIP, "443"), func() string { return u.Host })
	if err != nil {
		return err
	}
	n.forwarder = l
	return nil
}

// Forward listens on addr and copies each connection to and from the address target returns at
// the time of the connection. It returns the listener; closing it stops forwarding.
func Forward(addr string, target func() string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", target())
				if err != nil {
					return
				}
				defer up.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
				go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return l, nil
}

// mountNodeFs makes the kubelet's root directory a filesystem of its own: a sparse ext4 image
// on a loop device. nodefs is then that filesystem and imagefs (containerd's root, on the
// machine's disk) another, as on a node with a dedicated image disk, and a disk test fills
// nodefs without racing anything else that writes to the machine's disk.
func (n *Node) mountNodeFs(ctx context.Context) error {
	size := n.opts.NodeFsSize
	if size == 0 {
		size = 4 << 30
	}
	return n.mountLoop(ctx, filepath.Join(n.Dir, "nodefs.img"), n.RootDir, size)
}

// mountImageFs makes containerd's root a filesystem of its own of ImageFsSize (sparse), when
// set, so that images can fill it (the kubelet's image garbage collection, issue 47).
func (n *Node) mountImageFs(ctx context.Context) error {
	if n.opts.ImageFsSize == 0 {
		return nil
	}
	return n.mountLoop(ctx, filepath.Join(n.Dir, "imagefs.img"), n.ContainerdRoot, n.opts.ImageFsSize)
}

// mountLoop makes a sparse ext4 image of size at img and loop-mounts it at dir until Stop.
func (n *Node) mountLoop(ctx context.Context, img, dir string, size int64) error {
	f, err := os.Create(img)
	if err != nil {
		return err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		return err
	}
	f.Close()
	if err := run(ctx, "mkfs.ext4", "-q", "-F", "-m", "0", img); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// mount -o loop picks a free loop device and detaches it at umount.
	if err := run(ctx, "mount", "-o", "loop", img, dir); err != nil {
		return err
	}
	n.undo = append(n.undo, func() error {
		unmountUnder(dir)
		return nil
	})
	return nil
}

// unmountUnder unmounts every mount at or under dir, deepest first (the kubelet's volume
// tmpfs mounts, containerd's overlay rootfs and shm mounts, the nodefs loop mount).
func unmountUnder(dir string) {
	if dir == "" {
		return
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var mounts []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mounts = append(mounts, mp)
		}
	}
	f.Close()
	slices.SortFunc(mounts, func(a, b string) int { return len(b) - len(a) })
	for _, mp := range mounts {
		if err := syscall.Unmount(mp, 0); err != nil {
			_ = syscall.Unmount(mp, syscall.MNT_DETACH)
		}
	}
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// kubeTunables are the kernel settings the kubelet's container manager sets at start
// (setupKernelTunables); keepSysctls puts the host's values back at Stop.
var kubeTunables = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops"}

func (n *Node) keepSysctls() {
	for _, k := range kubeTunables {
		path := "/proc/sys/" + k
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		n.undo = append(n.undo, func() error { return os.WriteFile(path, b, 0o644) })
	}
}

// removeKubeCgroups removes the kubelet's cgroups (kubepods under each controller, and the
// burstable and besteffort QoS ones below it), deepest first. A cgroup with tasks left stays.
func removeKubeCgroups() {
	var dirs []string
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		entries, err := os.ReadDir(root)
		if err != nil {
			continue
		}
		for _, e := range entries {
			for _, base := range []string{filepath.Join(root, e.Name(), "kubepods"), filepath.Join(root, "kubepods")} {
				_ = filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
					if err == nil && d.IsDir() {
						dirs = append(dirs, p)
					}
					return nil
				})
			}
		}
	}
	slices.SortFunc(dirs, func(a, b string) int { return len(b) - len(a) })
	for _, d := range dirs {
		if err := syscall.Rmdir(d); err != nil && !errors.Is(err, os.ErrNotExist) {
			continue
		}
	}
}

// removeHostPortRules deletes portmap's per-sandbox rules of this network ("dnat name:
// \"reprieve-node\"") from the nat table, and their chains.
func removeHostPortRules() {
	ctx := context.Background()
	out, err := exec.CommandContext(ctx, "iptables", "-t", "nat", "-S", "CNI-HOSTPORT-DNAT").Output()
	if err != nil {
		return // no portmap chains yet
	}
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(line, "-A CNI-HOSTPORT-DNAT ") || !strings.Contains(line, `dnat name: \"reprieve-node\"`) {
			continue
		}
		f := strings.Fields(line)
		chain := f[len(f)-1]
		// The rule as iptables-save prints it, quoted comment and all: delete by rule number
		// instead of re-quoting it.
		if n := ruleNumber(ctx, chain); n != "" {
			_ = run(ctx, "iptables", "-t", "nat", "-D", "CNI-HOSTPORT-DNAT", n)
		}
		_ = run(ctx, "iptables", "-t", "nat", "-F", chain)
		_ = run(ctx, "iptables", "-t", "nat", "-X", chain)
	}
}

// ruleNumber is the number of the CNI-HOSTPORT-DNAT rule that jumps to chain.
func ruleNumber(ctx context.Context, chain string) string {
	out, err := exec.CommandContext(ctx, "iptables", "-t", "nat", "-L", "CNI-HOSTPORT-DNAT", "-n", "--line-numbers").Output()
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[1] == chain {
			return f[0]
		}
	}
	return ""
}
