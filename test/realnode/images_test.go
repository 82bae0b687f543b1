package realnode

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"sigs.k8s.io/yaml"

	"github.com/reprieve-dev/reprieve/test/nodeenv"
	"github.com/reprieve-dev/reprieve/test/release/ociimage"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// reprieveImage is the image the chart's DaemonSet names: its repository and its appVersion.
func reprieveImage() (string, error) {
	root, err := testenv.RepoRoot()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile(filepath.Join(root, "deploy", "chart", "reprieve", "Chart.yaml"))
	if err != nil {
		return "", err
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &chart); err != nil {
		return "", fmt.Errorf("Chart.yaml: %w", err)
	}
	return "ghcr.io/reprieve-dev/reprieve:" + chart.AppVersion, nil
}

// importImages builds and imports the three images the tests run:
//   - reprieve's, read from an OCI image layout as `make release` writes it
//     (test/release/ociimage, the function release.sh runs): with $REPRIEVE_RELEASE_DIST, the
//     layout in that dist directory (`make release` output: the very image the packaged chart
//     pins by digest), else a layout written here by the same function from the binary under
//     test for this machine's platform. This node's platform is picked from its index as
//     containerd would pick it, and imported under the tag the chart in git names;
//   - the workload program;
//   - the notice client: Debian's static busybox for the shell, sed, grep, tr, sleep and kill
//     of the documented script, and this machine's curl with the libraries it loads.
func importImages(ctx context.Context) error {
	ref, err := reprieveImage()
	if err != nil {
		return err
	}
	dir, err := releaseLayout()
	if err != nil {
		return err
	}
	img, digest, err := ociimage.PlatformImage(dir, runtime.GOARCH)
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "realnode: the agent's image is linux/%s of the release layout %s (index %s)\n", runtime.GOARCH, dir, digest)
	if err := node.Import(ctx, ref, img); err != nil {
		return err
	}
	if err := checkImported(ctx, ref, img); err != nil {
		return err
	}

	wl, err := os.ReadFile(workloadBin)
	if err != nil {
		return err
	}
	img, err = nodeenv.Image([]nodeenv.File{
		{Path: "/tmp", Dir: true, Mode: 0o1777},
		{Path: "/workload", Mode: 0o755, Data: wl},
	}, v1.Config{Entrypoint: []string{"/workload"}})
	if err != nil {
		return err
	}
	if err := node.Import(ctx, workloadImage, img); err != nil {
		return err
	}

	busybox, err := os.ReadFile("/bin/busybox")
	if err != nil {
		return fmt.Errorf("the notice client's shell: %w", err)
	}
	files := []nodeenv.File{
		{Path: "/bin", Dir: true, Mode: 0o755},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
		{Path: "/bin/busybox", Mode: 0o755, Data: busybox},
	}
	for _, applet := range []string{"sh", "sed", "grep", "tr", "sleep", "kill", "cat", "echo", "date", "touch"} {
		files = append(files, nodeenv.File{Path: "/bin/" + applet, Link: "busybox", Mode: 0o777})
	}
	curl, err := nodeenv.HostFiles(ctx, "/usr/bin/curl")
	if err != nil {
		return fmt.Errorf("the notice client's curl: %w", err)
	}
	img, err = nodeenv.Image(append(files, curl...), v1.Config{
		Entrypoint: []string{"/bin/sh"},
		Env:        []string{"PATH=/usr/bin:/bin"},
	})
	if err != nil {
		return err
	}
	return node.Import(ctx, curlImage, img)
}

// releaseLayout is the directory of the agent's OCI image layout: $REPRIEVE_RELEASE_DIST's
// reprieve-image, checked against its reprieve-image.digest, or one written into logDir by
// the function `make release` runs, from the binary under test.
func releaseLayout() (string, error) {
	if dist := os.Getenv("REPRIEVE_RELEASE_DIST"); dist != "" {
		dir := filepath.Join(dist, "reprieve-image")
		b, err := os.ReadFile(filepath.Join(dist, "reprieve-image.digest"))
		if err != nil {
			return "", fmt.Errorf("$REPRIEVE_RELEASE_DIST is not a `make release` output: %w", err)
		}
		_, d, err := ociimage.PlatformImage(dir, runtime.GOARCH)
		if err != nil {
			return "", err
		}
		if want := strings.TrimSpace(string(b)); d.String() != want {
			return "", fmt.Errorf("the layout in %s has index %s, its digest file says %s", dir, d, want)
		}
		return dir, nil
	}
	dir := filepath.Join(logDir, "reprieve-image")
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err == nil {
		return dir, nil // written earlier in this run: the images are imported again (series_test.go)
	}
	if _, err := ociimage.WriteLayout(dir, []ociimage.Binary{{Arch: runtime.GOARCH, Path: reprieveBin}}, ociimage.Options{Version: "v0.0.0-e2e"}); err != nil {
		return "", fmt.Errorf("the agent's image layout: %w", err)
	}
	return dir, nil
}

// checkImported: the image containerd holds as ref has img's config, whose digest is the image
// ID the CRI reports to the kubelet, so that the pod the install test starts runs the layout's
// image. (Import goes through a docker archive, which containerd re-manifests, so the
// manifest's digest is containerd's own; the config and the layers are the layout's.)
func checkImported(ctx context.Context, ref string, img v1.Image) error {
	want, err := img.ConfigName()
	if err != nil {
		return err
	}
	ctr := func(args ...string) ([]byte, error) {
		out, err := exec.CommandContext(ctx, "ctr", append([]string{"--address", node.Socket, "--namespace", "k8s.io"}, args...)...).Output()
		if err != nil {
			return nil, fmt.Errorf("ctr %s: %w", strings.Join(args, " "), err)
		}
		return out, nil
	}
	ls, err := ctr("images", "ls", "-q", "name=="+ref)
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(ls)) != ref {
		return fmt.Errorf("containerd does not list %s after the import: %q", ref, ls)
	}
	// `ctr images ls` prints REF TYPE DIGEST ...: the manifest containerd made.
	full, err := ctr("images", "ls", "name=="+ref)
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSpace(string(full)), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) < 3 {
		return fmt.Errorf("ctr images ls %s: %q", ref, full)
	}
	manifest, err := ctr("content", "get", f[2])
	if err != nil {
		return err
	}
	var m struct {
		Config struct {
			Digest string `json:"digest"`
		} `json:"config"`
	}
	if err := json.Unmarshal(manifest, &m); err != nil {
		return fmt.Errorf("the manifest of %s in containerd: %w", ref, err)
	}
	if m.Config.Digest != want.String() {
		return fmt.Errorf("containerd's %s has config %s, the release layout's image %s", ref, m.Config.Digest, want)
	}
	return nil
}
