package volumes

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/kubelet"
)

// TestVolumeReleaseOf (issue 40, item 1): the time a pod with a volume that needs attaching must
// be gone before the deadline, bounded from the kubelet's nodeStatusUpdateFrequency (with the
// 4% jitter of its status loop) plus the unmount allowance; the kubelet's default 10 s, said
// so, when its configuration is unknown; a flag's value or off as given.
func TestVolumeReleaseOf(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "etc/kubelet"), 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(root, "etc/kubelet/config.yaml")
	if err := os.WriteFile(file, []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nnodeStatusUpdateFrequency: 20s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, flag, config string
		want               time.Duration
		from               string
	}{
		{name: "from the kubelet's configuration", flag: "auto", config: "/etc/kubelet/config.yaml", want: 5*time.Second + 20800*time.Millisecond, from: "nodeStatusUpdateFrequency 20s"},
		{name: "unknown configuration: the kubelet's default, said", flag: "auto", config: "/missing.yaml", want: 5*time.Second + 10400*time.Millisecond, from: "unknown"},
		{name: "off", flag: "off", want: 0, from: "off"},
		{name: "a duration", flag: "30s", want: 30 * time.Second, from: "--volume-release"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := config.DefaultConfig()
			cfg.HostRoot, cfg.KubeletConfig, cfg.VolumeRelease = root, c.config, c.flag
			d, from := ReleaseOf(cfg, kubelet.Find(cfg.KubeletLookup()))
			if d != c.want || !strings.Contains(from, c.from) {
				t.Fatalf("ReleaseOf = %s (%s), want %s (%s)", d, from, c.want, c.from)
			}
		})
	}
	for _, bad := range []string{"soon", "-5s", "0s"} {
		if _, _, err := config.ParseVolumeRelease(bad); err == nil || !strings.Contains(err.Error(), "--volume-release") {
			t.Errorf("--volume-release %q: err %v, want one naming the flag", bad, err)
		}
	}
}
