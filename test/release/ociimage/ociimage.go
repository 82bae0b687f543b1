// Package ociimage builds reprieve's container image without a Docker daemon: one image per
// platform from the static binaries `make release` cross-compiles, gathered in a multi-arch OCI
// image index, written as an OCI image layout (https://github.com/opencontainers/image-spec,
// image-layout.md). go-containerregistry makes the manifests, configs, digests and the layout;
// this package only writes the one layer's files.
//
// The image is the Dockerfile's (distroless/static:nonroot with /reprieve as entrypoint), built
// on scratch so that no base image has to be pulled: the nonroot user 65532 with its /etc/passwd
// and /etc/group entries and home, /tmp, and a CA bundle, because the agent's webhooks
// (agent/notify) accept https only by default and Go reads the system roots from
// /etc/ssl/certs/ca-certificates.crt. The bundle is NSS's, from
// golang.org/x/crypto/x509roots/fallback/bundle pinned in go.mod, not the build machine's, so
// that one commit gives one digest on any machine. Every entry's time is the epoch, and so is
// the config's: the digest depends only on the binaries, the version and the revision.
package ociimage

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

// Binary is one platform's static reprieve binary, and optionally its SBOM, which the index
// names by file and SHA-256 beside the platform's manifest.
type Binary struct {
	Arch string // GOARCH: amd64, arm64
	Path string
	SBOM string
}

// Options label the image as the Dockerfile does.
type Options struct {
	Version  string
	Revision string
}

// SBOMAnnotation is the key, on a platform's descriptor in the index, naming its SPDX SBOM
// (file name and sha256), which `make release` writes beside the layout.
const SBOMAnnotation = "dev.reprieve.sbom"

// Source is the repository the image's labels name.
const Source = "https://github.com/reprieve-dev/reprieve"

// epoch is every time in the image, so that the same inputs give the same digest.
var epoch = time.Unix(0, 0).UTC()

// WriteLayout writes the multi-arch image of bins as an OCI layout in dir (created; it must
// not hold a layout already) and returns the digest of its image index, the digest a chart pins.
func WriteLayout(dir string, bins []Binary, opts Options) (v1.Hash, error) {
	if len(bins) == 0 {
		return v1.Hash{}, fmt.Errorf("no binaries to build an image of")
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for _, b := range bins {
		img, err := Image(b.Path, b.Arch, opts)
		if err != nil {
			return v1.Hash{}, err
		}
		desc := v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: b.Arch}}
		if b.SBOM != "" {
			sum, err := fileSHA256(b.SBOM)
			if err != nil {
				return v1.Hash{}, err
			}
			desc.Annotations = map[string]string{SBOMAnnotation: baseName(b.SBOM) + " sha256:" + sum}
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: desc})
	}
	idx = mutate.Annotations(idx, labels(opts)).(v1.ImageIndex)
	if _, err := os.Stat(dir); err == nil {
		return v1.Hash{}, fmt.Errorf("writing the image layout: %s exists: give a new directory", dir)
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return v1.Hash{}, fmt.Errorf("creating the image layout %s: %w", dir, err)
	}
	ann := map[string]string{"org.opencontainers.image.ref.name": opts.Version}
	if err := p.AppendIndex(idx, layout.WithAnnotations(ann)); err != nil {
		return v1.Hash{}, fmt.Errorf("writing the image index into %s: %w", dir, err)
	}
	d, err := idx.Digest()
	if err != nil {
		return v1.Hash{}, fmt.Errorf("digest of the image index: %w", err)
	}
	return d, nil
}

// Image is one platform's image of the binary at bin.
func Image(bin, arch string, opts Options) (v1.Image, error) {
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("reading the binary: %w", err)
	}
	l, err := layer(data)
	if err != nil {
		return nil, fmt.Errorf("the layer of %s: %w", bin, err)
	}
	img := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{Layer: l, History: v1.History{
		Created: v1.Time{Time: epoch}, CreatedBy: "reprieve test/release/ociimage: /reprieve, nonroot user, CA bundle", Comment: "no base image",
	}})
	if err != nil {
		return nil, fmt.Errorf("adding the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Created = "linux", arch, v1.Time{Time: epoch}
	cf.Config = v1.Config{
		User:       "65532:65532",
		Entrypoint: []string{"/reprieve"},
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "SSL_CERT_FILE=" + caPath},
		WorkingDir: "/",
		Labels:     labels(opts),
	}
	return mutate.ConfigFile(img, cf)
}

// labels are the Dockerfile's OCI labels, but for the time (the epoch: reproducible).
func labels(opts Options) map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":         "reprieve",
		"org.opencontainers.image.description":   "Node-local Kubernetes agent: drains spot and preemptible nodes before the cloud reclaims them",
		"org.opencontainers.image.source":        Source,
		"org.opencontainers.image.url":           Source,
		"org.opencontainers.image.documentation": Source + "/blob/main/docs/install.md",
		"org.opencontainers.image.version":       opts.Version,
	}
	if opts.Revision != "" {
		l["org.opencontainers.image.revision"] = opts.Revision
	}
	return l
}

const caPath = "/etc/ssl/certs/ca-certificates.crt"

// file is one entry of the layer.
type file struct {
	path     string
	mode     int64
	dir      bool
	data     []byte
	uid, gid int
}

// layer is the image's one layer: distroless/static:nonroot's layout with the binary.
func layer(bin []byte) (v1.Layer, error) {
	ca, err := caBundle()
	if err != nil {
		return nil, err
	}
	files := []file{
		{path: "etc", dir: true, mode: 0o755},
		{path: "etc/ssl", dir: true, mode: 0o755},
		{path: "etc/ssl/certs", dir: true, mode: 0o755},
		{path: "home", dir: true, mode: 0o755},
		{path: "home/nonroot", dir: true, mode: 0o700, uid: 65532, gid: 65532},
		{path: "tmp", dir: true, mode: 0o1777},
		{path: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{path: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
		{path: strings.TrimPrefix(caPath, "/"), mode: 0o644, data: ca},
		{path: "reprieve", mode: 0o755, data: bin},
	}
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.path, Mode: f.mode, Uid: f.uid, Gid: f.gid, ModTime: epoch, Format: tar.FormatPAX}
		if f.dir {
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := w.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", f.path, err)
		}
		if _, err := w.Write(f.data); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", f.path, err)
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
}

// caBundle is NSS's roots as PEM. A root NSS trusts only for certificates issued before a date
// (Root.Constraint) cannot say so in a PEM bundle, so it is left out rather than trusted
// without its limit.
func caBundle() ([]byte, error) {
	var buf bytes.Buffer
	n := 0
	for r := range bundle.Roots() {
		if r.Constraint != nil {
			continue
		}
		if err := pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: r.Certificate}); err != nil {
			return nil, fmt.Errorf("encoding the CA bundle: %w", err)
		}
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("the CA bundle is empty")
	}
	return buf.Bytes(), nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("opening the SBOM: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("hashing %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

func baseName(p string) string { return p[strings.LastIndex(p, "/")+1:] }

// PlatformImage reads the layout WriteLayout wrote in dir: the digest of its image index and
// the image of linux/arch in it.
func PlatformImage(dir, arch string) (v1.Image, v1.Hash, error) {
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, v1.Hash{}, fmt.Errorf("reading the image layout %s: %w", dir, err)
	}
	m, err := top.IndexManifest()
	if err != nil {
		return nil, v1.Hash{}, fmt.Errorf("reading %s/index.json: %w", dir, err)
	}
	if len(m.Manifests) != 1 || !m.Manifests[0].MediaType.IsIndex() {
		return nil, v1.Hash{}, fmt.Errorf("the image layout %s: want one image index in index.json, have %d entries", dir, len(m.Manifests))
	}
	d := m.Manifests[0].Digest
	idx, err := top.ImageIndex(d)
	if err != nil {
		return nil, v1.Hash{}, fmt.Errorf("the image index %s: %w", d, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, v1.Hash{}, err
	}
	for _, desc := range im.Manifests {
		if desc.Platform != nil && desc.Platform.OS == "linux" && desc.Platform.Architecture == arch {
			img, err := idx.Image(desc.Digest)
			if err != nil {
				return nil, v1.Hash{}, fmt.Errorf("the linux/%s image %s: %w", arch, desc.Digest, err)
			}
			return img, d, nil
		}
	}
	return nil, v1.Hash{}, fmt.Errorf("the image index %s has no linux/%s image", d, arch)
}
