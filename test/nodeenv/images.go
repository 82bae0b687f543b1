package nodeenv

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/reprieve-dev/reprieve/test/testenv"
)

// File is one entry of an image layer: a regular file (Data), a directory (Dir) or a symbolic
// link (Link).
type File struct {
	Path     string
	Mode     int64
	Data     []byte
	Dir      bool
	Link     string
	UID, GID int
}

// epoch is every entry's modification time, so that the same files give the same layer.
var epoch = time.Unix(0, 0)

// layer makes one layer of files. The layer's tar stream is the only thing written here;
// go-containerregistry makes the image around it (digests, config, manifest, archive).
func layer(files []File) (v1.Layer, error) {
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: strings.TrimPrefix(f.Path, "/"), Mode: f.Mode, Uid: f.UID, Gid: f.GID, ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case f.Dir:
			h.Typeflag, h.Name = tar.TypeDir, h.Name+"/"
		case f.Link != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, f.Link
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.Data))
		}
		if err := w.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", f.Path, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := w.Write(f.Data); err != nil {
				return nil, fmt.Errorf("layer entry %s: %w", f.Path, err)
			}
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
}

// Image builds a linux/amd64 (the machine's architecture) image of one layer of files with
// config cfg.
func Image(files []File, cfg v1.Config) (v1.Image, error) {
	l, err := layer(files)
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, l)
	if err != nil {
		return nil, fmt.Errorf("adding the layer: %w", err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config, cf.Created = "linux", goarch(), cfg, v1.Time{Time: epoch}
	return mutate.ConfigFile(img, cf)
}

// Import writes img as a docker archive tagged ref and imports it into the node's containerd,
// where the kubelet finds it (pods use imagePullPolicy: Never: there is no registry).
func (n *Node) Import(ctx context.Context, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	path := filepath.Join(n.Dir, "images", strings.NewReplacer("/", "_", ":", "_").Replace(ref)+".tar")
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := tarball.WriteToFile(path, tag, img); err != nil {
		return fmt.Errorf("writing image %s: %w", ref, err)
	}
	if _, err := n.ctr(ctx, "images", "import", path); err != nil {
		return fmt.Errorf("importing image %s: %w", ref, err)
	}
	return nil
}

// ImportFiller imports an image of one file of sizeMiB zeros tagged ref, as a pull of an
// image of that size would fill imagefs: the layer is unpacked into containerd's snapshots
// (its compressed blob is small). The file's name makes each ref's layer its own.
func (n *Node) ImportFiller(ctx context.Context, ref string, sizeMiB int) error {
	img, err := Image([]File{{Path: "/filler/" + strings.NewReplacer("/", "_", ":", "_").Replace(ref), Mode: 0o644, Data: make([]byte, sizeMiB<<20)}}, v1.Config{})
	if err != nil {
		return err
	}
	// The CRI names an image by its config's digest too: RemoveImages removes both names.
	id, err := img.ConfigName()
	if err != nil {
		return err
	}
	n.mu.Lock()
	if n.imageIDs == nil {
		n.imageIDs = map[string]string{}
	}
	n.imageIDs[ref] = id.String()
	n.mu.Unlock()
	err = n.Import(ctx, ref, img)
	// The archive written for the import lies on the machine's disk: not kept.
	_ = os.RemoveAll(filepath.Join(n.Dir, "images", strings.NewReplacer("/", "_", ":", "_").Replace(ref)+".tar"))
	return err
}

// RemoveImages removes every image ImportFiller imported whose name starts with prefix, under
// both its names (the tag, and the config's digest the CRI gives it); containerd then collects
// their content and snapshots.
func (n *Node) RemoveImages(ctx context.Context, prefix string) error {
	out, err := n.ctr(ctx, "images", "ls", "-q")
	if err != nil {
		return err
	}
	present := map[string]bool{}
	for _, ref := range strings.Fields(string(out)) {
		present[ref] = true
	}
	var refs []string
	n.mu.Lock()
	for ref, id := range n.imageIDs {
		if !strings.HasPrefix(ref, prefix) {
			continue
		}
		for _, name := range []string{ref, id} {
			if present[name] {
				refs = append(refs, name)
			}
		}
		delete(n.imageIDs, ref)
	}
	n.mu.Unlock()
	if len(refs) == 0 {
		return nil
	}
	if _, err := n.ctr(ctx, append([]string{"images", "rm", "--sync"}, refs...)...); err != nil {
		return fmt.Errorf("removing %d images: %w", len(refs), err)
	}
	return nil
}

// pauseImage builds the sandbox image from the pause program beside this package.
func pauseImage(ctx context.Context, n *Node) (v1.Image, error) {
	bin := filepath.Join(n.Dir, "pause")
	if err := GoBuild(ctx, bin, "./test/nodeenv/pause"); err != nil {
		return nil, err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	return Image([]File{{Path: "/pause", Mode: 0o755, Data: data}}, v1.Config{Entrypoint: []string{"/pause"}, User: "65535:65535"})
}

func (n *Node) importImage(ctx context.Context, ref string, build func(context.Context, *Node) (v1.Image, error)) error {
	img, err := build(ctx, n)
	if err != nil {
		return fmt.Errorf("building image %s: %w", ref, err)
	}
	return n.Import(ctx, ref, img)
}

// GoBuild builds the main package pkg (relative to the repository root) as a static binary
// at out.
func GoBuild(ctx context.Context, out, pkg string) error {
	root, err := testenv.RepoRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", out, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build %s: %w: %s", pkg, err, b)
	}
	return nil
}

// HostFiles returns the files of a dynamically linked program of this machine with the shared
// libraries it loads, at their own paths, as `ldd` lists them: enough to run it in an image
// without a distribution.
func HostFiles(ctx context.Context, program string) ([]File, error) {
	out, err := exec.CommandContext(ctx, "ldd", program).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", program, err)
	}
	paths := []string{program}
	for _, line := range strings.Split(string(out), "\n") {
		// "libz.so.1 => /lib/x86_64-linux-gnu/libz.so.1 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			paths = append(paths, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			paths = append(paths, f[0])
		}
	}
	var files []File
	dirs := map[string]bool{}
	for _, p := range paths {
		data, err := os.ReadFile(p) // follows symbolic links: the library itself
		if err != nil {
			return nil, err
		}
		for d := filepath.Dir(p); d != "/" && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
			files = append(files, File{Path: d, Dir: true, Mode: 0o755})
		}
		files = append(files, File{Path: p, Mode: 0o755, Data: data})
	}
	// Parents before children in the layer.
	sortParentsFirst(files)
	return files, nil
}

// sortParentsFirst puts the directories first, shallowest first, then the rest in order.
func sortParentsFirst(files []File) {
	slices.SortStableFunc(files, func(a, b File) int {
		switch {
		case a.Dir && b.Dir:
			return strings.Count(a.Path, "/") - strings.Count(b.Path, "/")
		case a.Dir:
			return -1
		case b.Dir:
			return 1
		}
		return 0
	})
}

func goarch() string { return runtime.GOARCH }
