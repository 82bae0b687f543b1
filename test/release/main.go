// Command release writes the SPDX 2.3 SBOM of a reprieve binary from the module graph the Go
// linker recorded in it (debug/buildinfo): the main module, every module linked in with its
// version and go.sum hash, and the Go toolchain. `make release` runs it on each binary it builds:
//
//	go run ./test/release -bin dist/reprieve-linux-amd64 -out dist/reprieve-linux-amd64.spdx.json
//
// With -layout it writes the multi-arch image of the binaries instead (test/release/ociimage),
// prints the digest of its image index and writes it to -digest-file:
//
//	go run ./test/release -layout dist/reprieve-image -digest-file dist/reprieve-image.digest \
//	  -version 1.2.3 amd64=dist/reprieve-linux-amd64 arm64=dist/reprieve-linux-arm64
//
// (each binary's SBOM is expected beside it as BINARY.spdx.json, and named in the index).
//
// The graph comes from the binary itself, not from go.mod: a module go.mod lists but the linker
// dropped is not in the image, and a replaced module shows its replacement.
package main

import (
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/reprieve-dev/reprieve/test/release/ociimage"
)

func main() {
	bin := flag.String("bin", "", "the binary to describe")
	out := flag.String("out", "", "where to write the SBOM (default: standard output)")
	version := flag.String("version", "", "the release version (default: the main module's, \"(devel)\" for a local build)")
	layoutDir := flag.String("layout", "", "write the image of the ARCH=BINARY arguments as an OCI layout in this new directory")
	digestFile := flag.String("digest-file", "", "with -layout: where to write the image index's digest")
	revision := flag.String("revision", "", "with -layout: the source revision the image's labels name")
	flag.Parse()
	if *layoutDir != "" {
		if err := image(*layoutDir, *digestFile, *version, *revision, flag.Args()); err != nil {
			fmt.Fprintf(os.Stderr, "release: %v\n", err)
			os.Exit(1)
		}
		return
	}
	now, err := created(os.Getenv("SOURCE_DATE_EPOCH"), time.Now())
	if err != nil {
		fmt.Fprintf(os.Stderr, "release: %v\n", err)
		os.Exit(2)
	}
	if err := run(*bin, *out, *version, now); err != nil {
		fmt.Fprintf(os.Stderr, "release: %v\n", err)
		os.Exit(1)
	}
}

// created is the SBOM's creation time: $SOURCE_DATE_EPOCH (https://reproducible-builds.org/specs/source-date-epoch/,
// release.sh sets it to the commit's time) when set, so that a rebuild of one commit gives the
// same SBOM and so the same image digest, which names the SBOM's hash; else now.
func created(epoch string, now time.Time) (time.Time, error) {
	if epoch == "" {
		return now.UTC(), nil
	}
	s, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil || s < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since 1970", epoch)
	}
	return time.Unix(s, 0).UTC(), nil
}

// image writes the image layout of the ARCH=BINARY args and its digest.
func image(dir, digestFile, version, revision string, args []string) error {
	if version == "" {
		return fmt.Errorf("-layout needs -version")
	}
	if len(args) == 0 {
		return fmt.Errorf("-layout needs ARCH=BINARY arguments")
	}
	var bins []ociimage.Binary
	for _, a := range args {
		arch, bin, ok := strings.Cut(a, "=")
		if !ok || arch == "" || bin == "" {
			return fmt.Errorf("argument %q: want ARCH=BINARY", a)
		}
		b := ociimage.Binary{Arch: arch, Path: bin}
		if _, err := os.Stat(bin + ".spdx.json"); err == nil {
			b.SBOM = bin + ".spdx.json"
		}
		bins = append(bins, b)
	}
	d, err := ociimage.WriteLayout(dir, bins, ociimage.Options{Version: version, Revision: revision})
	if err != nil {
		return err
	}
	if digestFile != "" {
		if err := os.WriteFile(digestFile, []byte(d.String()+"\n"), 0o644); err != nil {
			return fmt.Errorf("writing the digest: %w", err)
		}
	}
	fmt.Println(d.String())
	return nil
}

func run(bin, out, version string, now time.Time) error {
	if bin == "" {
		return fmt.Errorf("-bin is required")
	}
	doc, err := sbom(bin, version, now)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding the SBOM: %w", err)
	}
	b = append(b, '\n')
	if out == "" {
		_, err = os.Stdout.Write(b)
		return err
	}
	if err := os.WriteFile(out, b, 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", out, err)
	}
	return nil
}

// The SPDX 2.3 JSON fields this SBOM uses (https://spdx.github.io/spdx-spec/v2.3/).
type document struct {
	SPDXVersion       string         `json:"spdxVersion"`
	DataLicense       string         `json:"dataLicense"`
	SPDXID            string         `json:"SPDXID"`
	Name              string         `json:"name"`
	DocumentNamespace string         `json:"documentNamespace"`
	CreationInfo      creationInfo   `json:"creationInfo"`
	Packages          []pkg          `json:"packages"`
	Relationships     []relationship `json:"relationships"`
}

type creationInfo struct {
	Created  string   `json:"created"`
	Creators []string `json:"creators"`
}

type pkg struct {
	Name             string        `json:"name"`
	SPDXID           string        `json:"SPDXID"`
	VersionInfo      string        `json:"versionInfo,omitempty"`
	DownloadLocation string        `json:"downloadLocation"`
	FilesAnalyzed    bool          `json:"filesAnalyzed"`
	Checksums        []checksum    `json:"checksums,omitempty"`
	ExternalRefs     []externalRef `json:"externalRefs,omitempty"`
	Comment          string        `json:"comment,omitempty"`
}

type checksum struct {
	Algorithm     string `json:"algorithm"`
	ChecksumValue string `json:"checksumValue"`
}

type externalRef struct {
	ReferenceCategory string `json:"referenceCategory"`
	ReferenceType     string `json:"referenceType"`
	ReferenceLocator  string `json:"referenceLocator"`
}

type relationship struct {
	Element string `json:"spdxElementId"`
	Type    string `json:"relationshipType"`
	Related string `json:"relatedSpdxElement"`
}

// sbom reads the build info of bin and describes it as the given version.
func sbom(bin, version string, now time.Time) (*document, error) {
	info, err := buildinfo.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("reading the build info of %s: %w", bin, err)
	}
	f, err := os.Open(bin)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", bin, err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, fmt.Errorf("hashing %s: %w", bin, err)
	}
	name := filepath.Base(bin)
	root := pkg{
		Name: name, SPDXID: "SPDXRef-Binary", VersionInfo: info.Main.Version, DownloadLocation: "NOASSERTION",
		Checksums: []checksum{{Algorithm: "SHA256", ChecksumValue: hex.EncodeToString(h.Sum(nil))}},
		Comment:   "built with " + info.GoVersion + settingsComment(info.Settings),
	}
	if version != "" {
		root.VersionInfo = version
	}
	doc := &document{
		SPDXVersion: "SPDX-2.3", DataLicense: "CC0-1.0", SPDXID: "SPDXRef-DOCUMENT", Name: name,
		DocumentNamespace: "https://github.com/reprieve-dev/reprieve/sbom/" + name + "-" + root.Checksums[0].ChecksumValue[:16],
		CreationInfo:      creationInfo{Created: now.Format(time.RFC3339), Creators: []string{"Tool: reprieve test/release (debug/buildinfo)"}},
		Packages:          []pkg{root},
		Relationships:     []relationship{{"SPDXRef-DOCUMENT", "DESCRIBES", "SPDXRef-Binary"}},
	}
	add := func(path, version, sum string) {
		id := "SPDXRef-Module-" + spdxID(path)
		p := pkg{Name: path, SPDXID: id, VersionInfo: version, DownloadLocation: "NOASSERTION",
			ExternalRefs: []externalRef{{"PACKAGE-MANAGER", "purl", "pkg:golang/" + path + "@" + version}}}
		if sum != "" {
			// go.sum's h1: hash, the SHA-256 of the module's file tree (golang.org/x/mod/sumdb/dirhash).
			p.Comment = "go.sum " + sum
		}
		doc.Packages = append(doc.Packages, p)
		doc.Relationships = append(doc.Relationships, relationship{"SPDXRef-Binary", "CONTAINS", id})
	}
	add("go", strings.TrimPrefix(info.GoVersion, "go"), "")
	doc.Packages[len(doc.Packages)-1].ExternalRefs[0].ReferenceLocator = "pkg:golang/stdlib@" + strings.TrimPrefix(info.GoVersion, "go")
	for _, d := range info.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		add(d.Path, d.Version, d.Sum)
	}
	return doc, nil
}

// spdxID turns a module path into the letters, digits, dots and dashes an SPDX ID allows.
func spdxID(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-':
			return r
		}
		return '-'
	}, s)
}

func settingsComment(settings []debug.BuildSetting) string {
	var parts []string
	for _, s := range settings {
		switch s.Key {
		case "GOOS", "GOARCH", "CGO_ENABLED", "-trimpath", "-ldflags", "vcs.revision":
			parts = append(parts, s.Key+"="+s.Value)
		}
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}
