package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/reprieve-dev/reprieve/kubelet"
	"github.com/reprieve-dev/reprieve/test/profiles"
)

// TestCopyKubeletFiles: the AKS profile's two root-only files (AgentBaker's 0600) are copied at
// their host paths, 0444, byte for byte, and the agent's reader finds the profile's thresholds in
// the copies alone; an absent file is skipped; a symlink, a directory and an oversized file are
// refused, said, and skipped; nothing else of the directory is copied; bad flags exit 2.
func TestCopyKubeletFiles(t *testing.T) {
	p := profiles.AKSSpot()
	root, dst := t.TempDir(), t.TempDir()
	if err := p.WriteHostRoot(root); err != nil {
		t.Fatal(err)
	}
	// Beside them in /etc/default: what must not be copied, and the hostile cases.
	for name, content := range map[string]string{"other": "SECRET=1\n", "huge": strings.Repeat("x", maxKubeletFile+1)} {
		if err := os.WriteFile(filepath.Join(root, "etc/default", name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("/etc/shadow", filepath.Join(root, "etc/default/link")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(root, "etc/default/dir"), 0o755); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := runCopyKubeletFiles([]string{"--host-root=" + root, "--to=" + dst,
		profiles.AKSFlags, profiles.AKSConfig, "/etc/default/absent", "/etc/default/link", "/etc/default/dir", "/etc/default/huge"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s%s", code, out.String(), errOut.String())
	}
	for _, f := range []string{profiles.AKSFlags, profiles.AKSConfig} {
		want, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(dst, f))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: copied %q (%v), want the host's bytes", f, got, err)
			continue
		}
		if st, _ := os.Stat(filepath.Join(dst, f)); st.Mode().Perm() != 0o444 {
			t.Errorf("%s: mode %v, want 0444 (readable by the agent's non-root user)", f, st.Mode().Perm())
		}
	}
	entries, _ := os.ReadDir(filepath.Join(dst, "etc/default"))
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if len(names) != 2 {
		t.Errorf("copied %v; want only the two kubelet files", names)
	}
	for _, want := range []string{"/etc/default/link: not copied", "a symlink, not followed", "/etc/default/dir: not copied", "not a regular file",
		"/etc/default/huge: not copied", "larger than"} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut.String())
		}
	}
	if !strings.Contains(out.String(), "/etc/default/absent: absent, skipped") {
		t.Errorf("stdout lacks the absent file:\n%s", out.String())
	}
	// The agent reads the copies as it reads the host: the profile's configuration.
	c, err := kubelet.FindConfig(kubelet.Lookup{HostRoot: dst})
	if err != nil || !c.Found || c.Path != filepath.Join(dst, p.ConfigPath) {
		t.Fatalf("reading the copies: found %v at %s (%v); want %s", c.Found, c.Path, err, p.ConfigPath)
	}
	var hard []string
	for _, th := range c.Hard {
		hard = append(hard, th.String())
	}
	if strings.Join(hard, ",") != strings.Join(p.Hard, ",") {
		t.Errorf("thresholds from the copies %v, want the profile's %v", hard, p.Hard)
	}
	// A second run (the init container restarted) replaces the copies.
	out.Reset()
	if code := runCopyKubeletFiles([]string{"--host-root=" + root, "--to=" + dst, profiles.AKSFlags}, &out, &errOut); code != 0 || !strings.Contains(out.String(), "copied") {
		t.Errorf("second run: exit %d, %s", code, out.String())
	}

	for _, args := range [][]string{{"--to=" + dst}, {profiles.AKSFlags}, {"--to=" + dst, "etc/default/kubelet"}, {"--to=" + dst, "/etc/../etc/shadow"}, {"--nope"}} {
		if code := runCopyKubeletFiles(args, &out, &errOut); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
}
