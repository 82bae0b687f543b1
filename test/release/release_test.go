package main

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"debug/elf"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/reprieve-dev/reprieve/test/scenario"
	"github.com/reprieve-dev/reprieve/test/testenv"
)

// TestSBOMOfReprieve: the SBOM of the reprieve binary lists every module the linker recorded in
// it, each with a purl, and the toolchain.
func TestSBOMOfReprieve(t *testing.T) {
	// $REPRIEVE_BIN from make, else built here (no deadline).
	bin, err := scenario.BuildReprieve(context.Background(), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	doc, err := sbom(bin, "1.2.3", time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	if doc.Packages[0].VersionInfo != "1.2.3" || doc.Packages[0].Checksums[0].Algorithm != "SHA256" {
		t.Errorf("root package %+v: want version 1.2.3 and its SHA-256", doc.Packages[0])
	}
	names := map[string]string{}
	for _, p := range doc.Packages[1:] {
		names[p.Name] = p.VersionInfo
		if len(p.ExternalRefs) != 1 || !strings.HasPrefix(p.ExternalRefs[0].ReferenceLocator, "pkg:golang/") {
			t.Errorf("package %s has no golang purl: %+v", p.Name, p.ExternalRefs)
		}
	}
	if names["go"] == "" || names["k8s.io/client-go"] == "" || names["sigs.k8s.io/yaml"] == "" {
		t.Errorf("modules %v: want the toolchain, client-go and sigs.k8s.io/yaml", names)
	}
	if len(doc.Relationships) != len(doc.Packages) {
		t.Errorf("%d relationships for %d packages: want DESCRIBES plus one CONTAINS per module", len(doc.Relationships), len(doc.Packages))
	}
	if _, err := sbom(filepath.Join(t.TempDir(), "missing"), "", time.Now()); err == nil {
		t.Error("sbom of a missing file: no error")
	}
}

// TestRelease runs deploy/release.sh (what `make release` runs): an arm64 binary that is static
// and really arm64, an SBOM of each binary, and a chart package whose appVersion, and so the
// image tag, is the release. A VERSION with a leading v is refused.
func TestRelease(t *testing.T) {
	tools, err := testenv.ToolsBin()
	if err != nil {
		if os.Getenv("REPRIEVE_E2E_REQUIRED") == "1" {
			t.Fatalf("helm is needed (make tools): %v", err)
		}
		t.Skipf("skipping: %v (set REPRIEVE_E2E_REQUIRED=1 to make this a failure)", err)
	}
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	helm := filepath.Join(tools, "helm")
	release := func(version, out string) ([]byte, error) {
		// No deadline: the cross-compile for arm64 takes minutes on a cold cache.
		cmd := exec.Command("bash", filepath.Join(root, "deploy", "release.sh"), version, out)
		cmd.Env = append(os.Environ(), "HELM="+helm)
		return cmd.CombinedOutput()
	}
	if out, err := release("v1.0.0", t.TempDir()); err == nil || !strings.Contains(string(out), "leading v") {
		t.Errorf("release.sh v1.0.0: %v\n%s\nwant a refusal naming the leading v", err, out)
	}
	const version = "9.8.7"
	dist := t.TempDir()
	if out, err := release(version, dist); err != nil {
		t.Fatalf("release.sh: %v\n%s", err, out)
	}
	for arch, machine := range map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64} {
		bin := filepath.Join(dist, "reprieve-linux-"+arch)
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		if f.Machine != machine {
			t.Errorf("%s is for %s, want %s", bin, f.Machine, machine)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP {
				t.Errorf("%s asks for a dynamic loader: not static", bin)
			}
		}
		f.Close()
		var doc document
		b, err := os.ReadFile(bin + ".spdx.json")
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &doc); err != nil {
			t.Fatalf("%s.spdx.json: %v", bin, err)
		}
		if doc.SPDXVersion != "SPDX-2.3" || doc.Packages[0].VersionInfo != version || !strings.Contains(doc.Packages[0].Comment, "GOARCH="+arch) {
			t.Errorf("SBOM of %s: %s, root %+v; want SPDX-2.3 for version %s on %s", arch, doc.SPDXVersion, doc.Packages[0], version, arch)
		}
	}
	chartMeta := readChartYAML(t, filepath.Join(dist, "reprieve-"+version+".tgz"))
	if chartMeta["version"] != version || chartMeta["appVersion"] != version {
		t.Errorf("packaged Chart.yaml version %v appVersion %v, want both %s", chartMeta["version"], chartMeta["appVersion"], version)
	}
	cmd := exec.Command(helm, "template", "reprieve", filepath.Join(dist, "reprieve-"+version+".tgz"), "--set", "cloud=aws", "--show-only", "templates/daemonset.yaml")
	home := t.TempDir()
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	manifest, err := cmd.Output()
	if err != nil {
		t.Fatalf("helm template of the package: %v", err)
	}
	// The packaged chart names the image by the digest of the index release.sh built (issue 36,
	// item 5), where it named the appVersion's tag before; the version stays in the labels.
	digestFile, err := os.ReadFile(filepath.Join(dist, "reprieve-image.digest"))
	if err != nil {
		t.Fatal(err)
	}
	digest := strings.TrimSpace(string(digestFile))
	if !strings.Contains(string(manifest), "image: \"ghcr.io/reprieve-dev/reprieve@"+digest+"\"") {
		t.Errorf("the packaged chart's DaemonSet does not pin the image to %s:\n%s", digest, manifest)
	}
	if !strings.Contains(string(manifest), "app.kubernetes.io/version: \""+version+"\"") {
		t.Errorf("the packaged chart's DaemonSet lost its version label %s", version)
	}
	checkLayout(t, filepath.Join(dist, "reprieve-image"), digest, version, map[string]string{
		"amd64": filepath.Join(dist, "reprieve-linux-amd64"), "arm64": filepath.Join(dist, "reprieve-linux-arm64")})
	// The chart in git stays tag-based: the digest is set in the packaged copy only.
	cmd = exec.Command(helm, "template", "reprieve", filepath.Join(root, "deploy", "chart", "reprieve"), "--set", "cloud=aws", "--show-only", "templates/daemonset.yaml")
	cmd.Env = append(os.Environ(), "HELM_CONFIG_HOME="+home, "HELM_CACHE_HOME="+home, "HELM_DATA_HOME="+home)
	if manifest, err = cmd.Output(); err != nil {
		t.Fatalf("helm template of the chart in git: %v", err)
	}
	if strings.Contains(string(manifest), "@sha256:") || !strings.Contains(string(manifest), "image: \"ghcr.io/reprieve-dev/reprieve:") {
		t.Errorf("the chart in git should name the image by tag:\n%s", manifest)
	}
	sums, err := os.ReadFile(filepath.Join(dist, "SHA256SUMS"))
	if err != nil || strings.Count(string(sums), "\n") != 5 {
		t.Errorf("SHA256SUMS: %v\n%s\nwant five lines", err, sums)
	}
}

// readChartYAML returns Chart.yaml from a packaged chart.
func readChartYAML(t *testing.T, tgz string) map[string]any {
	t.Helper()
	f, err := os.Open(tgz)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			t.Fatalf("%s has no Chart.yaml", tgz)
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Name == "reprieve/Chart.yaml" {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			var m map[string]any
			if err := yaml.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			return m
		}
	}
}

// TestDockerfile: the image builds per TARGETARCH (a multi-platform build cross-compiles on the
// build machine's platform) and carries the OCI labels registries and scanners read.
func TestDockerfile(t *testing.T) {
	root, err := testenv.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--platform=$BUILDPLATFORM", "ARG TARGETARCH", "GOARCH=${TARGETARCH}",
		"org.opencontainers.image.source=", "org.opencontainers.image.version=\"${VERSION}\"", "org.opencontainers.image.revision="} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the Dockerfile lacks %s", want)
		}
	}
}
