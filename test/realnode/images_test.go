package realnode

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"sigs.k8s.io/yaml"

	"github.com/reprieve-dev/reprieve/test/nodeenv"
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
//   - reprieve's, in the Dockerfile's layout on distroless/static:nonroot: the static binary
//     at /reprieve as the entrypoint, user 65532:65532, distroless's /etc/passwd and
//     /etc/group entries for nonroot, /home/nonroot and /tmp. Not in it: distroless's CA
//     bundle, tzdata and os-release, which the agent does not read;
//   - the workload program;
//   - the notice client: Debian's static busybox for the shell, sed, grep, tr, sleep and kill
//     of the documented script, and this machine's curl with the libraries it loads.
func importImages(ctx context.Context) error {
	ref, err := reprieveImage()
	if err != nil {
		return err
	}
	bin, err := os.ReadFile(reprieveBin)
	if err != nil {
		return err
	}
	img, err := nodeenv.Image([]nodeenv.File{
		{Path: "/etc", Dir: true, Mode: 0o755},
		{Path: "/home", Dir: true, Mode: 0o755},
		{Path: "/home/nonroot", Dir: true, Mode: 0o700, UID: 65532, GID: 65532},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
		{Path: "/reprieve", Mode: 0o755, Data: bin},
	}, v1.Config{
		User:       "65532:65532",
		Entrypoint: []string{"/reprieve"},
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		WorkingDir: "/",
		Labels:     map[string]string{"org.opencontainers.image.title": "reprieve", "org.opencontainers.image.base.name": "gcr.io/distroless/static:nonroot"},
	})
	if err != nil {
		return err
	}
	if err := node.Import(ctx, ref, img); err != nil {
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
