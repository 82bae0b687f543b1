package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
)

// maxKubeletFile bounds each copied file: a kubelet configuration or flags file is a few KiB.
const maxKubeletFile = 1 << 20

// runCopyKubeletFiles is `reprieve copy-kubelet-files`, the chart's init container on AKS: the
// node bootstrap there (Azure/AgentBaker parts/linux/cloud-init/artifacts/cse_config.sh,
// configureK8s and ensureKubelet) writes the kubelet's configuration file
// /etc/default/kubeletconfig.json and its flags file /etc/default/kubelet root's only (0600),
// and the agent runs as non-root. Run as root with every capability dropped (root still reads
// the files it owns), read-only, it copies just the files named, each a regular file of at most
// 1 MiB, from under --host-root into --to (at the same host path), readable by the agent (0444),
// and nothing else of the host's directory. A file that is absent (a pool without a config file)
// is skipped; one it cannot copy is said on stderr and skipped too: the agent then reads the
// kubelet's configuration as unknown and says so (doctor, KubeletConfigUnknown), rather than
// not start at all. Only bad flags fail (exit 2).
func runCopyKubeletFiles(args []string, stdout, stderr io.Writer) int {
	flags := pflag.NewFlagSet("reprieve copy-kubelet-files", pflag.ContinueOnError)
	flags.SetOutput(stderr)
	hostRoot := flags.String("host-root", "/host", "where the host's directories holding the files are mounted")
	to := flags.String("to", "", "the directory to copy into (an emptyDir shared with the agent), each file at its host path")
	flags.Usage = func() {
		fmt.Fprintf(stderr, "Usage: reprieve copy-kubelet-files --to DIR [--host-root DIR] HOSTPATH...\n\n"+
			"Copies the kubelet's root-only configuration files (AKS: /etc/default/kubelet and\n"+
			"/etc/default/kubeletconfig.json) into DIR, readable by the agent: the chart's init container\n"+
			"(docs/install.md, \"The kubelet's configuration\").\n\n%s", flags.FlagUsages())
	}
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "reprieve copy-kubelet-files: %v\n", err)
		return 2
	}
	if *to == "" || flags.NArg() == 0 {
		fmt.Fprintln(stderr, "reprieve copy-kubelet-files: want --to DIR and at least one host path")
		return 2
	}
	for _, p := range flags.Args() {
		if !filepath.IsAbs(p) || strings.Contains(p, "..") {
			fmt.Fprintf(stderr, "reprieve copy-kubelet-files: %q: want an absolute host path without ..\n", p)
			return 2
		}
	}
	for _, p := range flags.Args() {
		switch n, err := copyHostFile(*hostRoot, *to, p); {
		case errors.Is(err, fs.ErrNotExist):
			fmt.Fprintf(stdout, "%s: absent, skipped\n", p)
		case err != nil:
			fmt.Fprintf(stderr, "%s: not copied, the agent will read it as unknown: %v\n", p, err)
		default:
			fmt.Fprintf(stdout, "%s: copied, %d bytes\n", p, n)
		}
	}
	return 0
}

// copyHostFile copies the host file p (under root) to the same path under dst, mode 0444. It
// refuses anything but a regular file (a symlink is not followed: it would resolve in this
// container, not on the host) and one larger than maxKubeletFile.
func copyHostFile(root, dst, p string) (int, error) {
	src := filepath.Join(root, p)
	f, err := os.OpenFile(src, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return 0, fmt.Errorf("opening %s: a symlink, not followed", src)
		}
		return 0, fmt.Errorf("opening %s: %w", src, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", src, err)
	}
	if !st.Mode().IsRegular() {
		return 0, fmt.Errorf("%s is not a regular file (%s)", src, st.Mode().Type())
	}
	data, err := io.ReadAll(io.LimitReader(f, maxKubeletFile+1))
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", src, err)
	}
	if len(data) > maxKubeletFile {
		return 0, fmt.Errorf("%s is larger than %d bytes", src, maxKubeletFile)
	}
	out := filepath.Join(dst, p)
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return 0, fmt.Errorf("copying %s: %w", p, err)
	}
	// A fresh file each time (an init container may run again): written aside, then renamed.
	tmp := out + ".tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("copying %s: %w", p, err)
	}
	if err := os.WriteFile(tmp, data, 0o444); err != nil {
		return 0, fmt.Errorf("copying %s: %w", p, err)
	}
	if err := os.Chmod(tmp, 0o444); err != nil { // the umask does not narrow it
		return 0, fmt.Errorf("copying %s: %w", p, err)
	}
	if err := os.Rename(tmp, out); err != nil {
		return 0, fmt.Errorf("copying %s: %w", p, err)
	}
	return len(data), nil
}
