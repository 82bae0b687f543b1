package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/reprieve-dev/reprieve/test/release/ociimage"
)

// TestImageLayout: the layout of two small stand-in binaries holds one OCI image index with
// both platforms, each image running its own binary as the nonroot user with a CA bundle Go can
// load; the same inputs give the same digest (a rebuild of a release can be checked against the
// published digest), another revision another; a directory that exists is refused.
func TestImageLayout(t *testing.T) {
	dir := t.TempDir()
	bins := map[string]string{}
	var list []ociimage.Binary
	for _, arch := range []string{"amd64", "arm64"} {
		p := filepath.Join(dir, "reprieve-linux-"+arch)
		if err := os.WriteFile(p, []byte("#!stand-in for "+arch+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p+".spdx.json", []byte(`{"spdxVersion":"SPDX-2.3","arch":"`+arch+`"}`), 0o644); err != nil {
			t.Fatal(err)
		}
		bins[arch] = p
		list = append(list, ociimage.Binary{Arch: arch, Path: p, SBOM: p + ".spdx.json"})
	}
	opts := ociimage.Options{Version: "1.2.3", Revision: "abc"}
	d1, err := ociimage.WriteLayout(filepath.Join(dir, "one"), list, opts)
	if err != nil {
		t.Fatal(err)
	}
	checkLayout(t, filepath.Join(dir, "one"), d1.String(), "1.2.3", bins)
	d2, err := ociimage.WriteLayout(filepath.Join(dir, "two"), list, opts)
	if err != nil {
		t.Fatal(err)
	}
	if d1 != d2 {
		t.Errorf("the same binaries gave two digests: %s and %s", d1, d2)
	}
	d3, err := ociimage.WriteLayout(filepath.Join(dir, "three"), list, ociimage.Options{Version: "1.2.3", Revision: "def"})
	if err != nil {
		t.Fatal(err)
	}
	if d3 == d1 {
		t.Errorf("another revision gave the same digest %s", d1)
	}
	if _, err := ociimage.WriteLayout(filepath.Join(dir, "one"), list, opts); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("a layout over an existing directory: %v, want a refusal", err)
	}
	if _, _, err := ociimage.PlatformImage(filepath.Join(dir, "one"), "riscv64"); err == nil || !strings.Contains(err.Error(), "no linux/riscv64") {
		t.Errorf("a platform the index lacks: %v, want an error naming it", err)
	}
}

// checkLayout checks an image layout as `make release` promises it: index.json names one OCI
// image index, whose digest is digest, with linux/amd64 and linux/arm64; each platform's image
// is that architecture's, runs /reprieve (the very bytes of bins[arch]) as 65532:65532, carries
// a CA bundle of parseable certificates, and names its SBOM by SHA-256.
func checkLayout(t *testing.T, dir, digest, version string, bins map[string]string) {
	t.Helper()
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(tm.Manifests) != 1 || tm.Manifests[0].Digest.String() != digest || tm.Manifests[0].MediaType != types.OCIImageIndex {
		t.Fatalf("index.json of %s: %+v, want one OCI image index %s", dir, tm.Manifests, digest)
	}
	if got := tm.Manifests[0].Annotations["org.opencontainers.image.ref.name"]; got != version {
		t.Errorf("the index's ref.name is %q, want %s", got, version)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, desc := range im.Manifests {
		if desc.Platform == nil || desc.Platform.OS != "linux" {
			t.Errorf("manifest %s has platform %+v, want linux", desc.Digest, desc.Platform)
			continue
		}
		arch := desc.Platform.Architecture
		seen[arch] = true
		bin, ok := bins[arch]
		if !ok {
			t.Errorf("the index has linux/%s, which no binary was built for", arch)
			continue
		}
		img, d, err := ociimage.PlatformImage(dir, arch)
		if err != nil {
			t.Fatal(err)
		}
		if d.String() != digest {
			t.Errorf("PlatformImage read index %s, want %s", d, digest)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if cf.OS != "linux" || cf.Architecture != arch || cf.Config.User != "65532:65532" ||
			len(cf.Config.Entrypoint) != 1 || cf.Config.Entrypoint[0] != "/reprieve" ||
			cf.Config.Labels["org.opencontainers.image.version"] != version {
			t.Errorf("linux/%s config: %s/%s user %q entrypoint %v labels %v", arch, cf.OS, cf.Architecture, cf.Config.User, cf.Config.Entrypoint, cf.Config.Labels)
		}
		files := imageFiles(t, img)
		want, err := os.ReadFile(bin)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(files["reprieve"], want) {
			t.Errorf("linux/%s: /reprieve is not %s (%d bytes, want %d)", arch, bin, len(files["reprieve"]), len(want))
		}
		if !strings.Contains(string(files["etc/passwd"]), "nonroot:x:65532:65532:") {
			t.Errorf("linux/%s: /etc/passwd lacks the nonroot user: %q", arch, files["etc/passwd"])
		}
		pool, n := x509.NewCertPool(), 0
		for rest := files["etc/ssl/certs/ca-certificates.crt"]; ; {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil {
				break
			}
			c, err := x509.ParseCertificate(b.Bytes)
			if err != nil {
				t.Fatalf("linux/%s: the CA bundle: %v", arch, err)
			}
			pool.AddCert(c)
			n++
		}
		if n < 50 {
			t.Errorf("linux/%s: the CA bundle has %d certificates, want NSS's (over 100)", arch, n)
		}
		sbom, err := os.ReadFile(bin + ".spdx.json")
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(sbom)
		if want := filepath.Base(bin) + ".spdx.json sha256:" + hex.EncodeToString(sum[:]); desc.Annotations[ociimage.SBOMAnnotation] != want {
			t.Errorf("linux/%s names its SBOM %q, want %q", arch, desc.Annotations[ociimage.SBOMAnnotation], want)
		}
	}
	if !seen["amd64"] || !seen["arm64"] || len(seen) != 2 {
		t.Errorf("the index has platforms %v, want linux/amd64 and linux/arm64", seen)
	}
}

// imageFiles reads every regular file of img's layers.
func imageFiles(t *testing.T, img v1.Image) map[string][]byte {
	t.Helper()
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(rc)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg {
				b, err := io.ReadAll(tr)
				if err != nil {
					t.Fatal(err)
				}
				files[h.Name] = b
			}
		}
		rc.Close()
	}
	return files
}

// TestCreatedFromSourceDateEpoch: the SBOM's time is $SOURCE_DATE_EPOCH when set (so a rebuild
// of a commit gives the same SBOM, and the same image digest), now otherwise; a value that is
// not seconds is refused by name.
func TestCreatedFromSourceDateEpoch(t *testing.T) {
	now := time.Date(2026, 12, 4, 21, 0, 0, 0, time.UTC)
	if got, err := created("", now); err != nil || !got.Equal(now) {
		t.Errorf("created(\"\") = %v, %v; want now", got, err)
	}
	if got, err := created("1764806400", now); err != nil || !got.Equal(time.Unix(1764806400, 0)) {
		t.Errorf("created(1764806400) = %v, %v", got, err)
	}
	if _, err := created("yesterday", now); err == nil || !strings.Contains(err.Error(), "SOURCE_DATE_EPOCH") {
		t.Errorf("created(yesterday): %v, want an error naming SOURCE_DATE_EPOCH", err)
	}
}
