// Package residency gives back the pages of the agent's own executable that it mapped once and
// no longer uses: the code and tables of start-up (flag parsing, the schemes, the first list of
// the node's pods) stay mapped, and counted in the process's RSS, until the kernel needs the
// memory. Releasing them with madvise(MADV_DONTNEED) unmaps them; the next access maps them
// again from the page cache, so nothing the agent needs is lost (docs/benchmarks.md, "Footprint:
// the executable's pages and the heap").
package residency

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
)

// Mapping is one mapping of /proc/<pid>/smaps.
type Mapping struct {
	Start, End uint64
	// Perms is the field as smaps prints it: "r-xp", "r--p", "rw-p"...
	Perms string
	// Dev is the device as smaps prints it ("fe:00"), Inode the file's inode (0: anonymous).
	Dev   string
	Inode uint64
	Path  string
	// Rss and Anonymous are bytes: resident, and resident private copies (copy-on-write).
	Rss, Anonymous uint64
}

// Releasable reports whether m may be released: a private, read-only mapping of the file at
// path that holds no private copy of a page. Such a mapping's pages are the file's own,
// so MADV_DONTNEED only unmaps them and a later access maps the file's content again (madvise(2):
// "private mappings [...] repopulate the memory contents from the up-to-date contents of the
// underlying mapped file"). A writable mapping (the executable's .data) or one that once was
// (a dynamic loader's RELRO: read-only after relocation, with its relocated pages as private
// copies) would lose what was written, so neither is released.
func (m Mapping) Releasable(path string) bool {
	return m.Inode != 0 && path != "" && m.Path == path && len(m.Perms) == 4 &&
		m.Perms[1] == '-' && m.Perms[3] == 'p' && m.Anonymous == 0
}

// ParseSmaps reads the mappings of an smaps file (proc_pid_smaps(5)).
func ParseSmaps(r io.Reader) ([]Mapping, error) {
	var out []Mapping
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if key, ok := strings.CutSuffix(f[0], ":"); ok {
			// A field of the current mapping: "Rss:   1234 kB", or VmFlags (no unit).
			if len(out) == 0 {
				return nil, fmt.Errorf("parsing smaps: field %q before any mapping", key)
			}
			if key != "Rss" && key != "Anonymous" {
				continue
			}
			if len(f) != 3 || f[2] != "kB" {
				return nil, fmt.Errorf("parsing smaps: %q", line)
			}
			kb, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("parsing smaps: %q: %w", line, err)
			}
			if key == "Rss" {
				out[len(out)-1].Rss = kb << 10
			} else {
				out[len(out)-1].Anonymous = kb << 10
			}
			continue
		}
		m, err := parseHeader(f)
		if err != nil {
			return nil, fmt.Errorf("parsing smaps: %q: %w", line, err)
		}
		out = append(out, m)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading smaps: %w", err)
	}
	return out, nil
}

// parseHeader parses "start-end perms offset dev inode [path]".
func parseHeader(f []string) (Mapping, error) {
	var m Mapping
	if len(f) < 5 {
		return m, fmt.Errorf("%d fields, want at least 5", len(f))
	}
	lo, hi, ok := strings.Cut(f[0], "-")
	if !ok {
		return m, fmt.Errorf("address range %q", f[0])
	}
	var err error
	if m.Start, err = strconv.ParseUint(lo, 16, 64); err != nil {
		return m, fmt.Errorf("address range %q: %w", f[0], err)
	}
	if m.End, err = strconv.ParseUint(hi, 16, 64); err != nil {
		return m, fmt.Errorf("address range %q: %w", f[0], err)
	}
	if m.End < m.Start {
		return m, fmt.Errorf("address range %q ends before it starts", f[0])
	}
	if m.Inode, err = strconv.ParseUint(f[4], 10, 64); err != nil {
		return m, fmt.Errorf("inode %q: %w", f[4], err)
	}
	m.Perms, m.Dev = f[1], f[3]
	if len(f) > 5 {
		m.Path = strings.Join(f[5:], " ")
	}
	return m, nil
}

// Result is what one Release did.
type Result struct {
	// Mappings is how many mappings were released, Bytes their size.
	Mappings int
	Bytes    uint64
	// Resident is how much of them was resident just before.
	Resident uint64
}

// Run releases the executable's pages (Release) once first has passed, then every every, until
// ctx ends: the first to give back start-up's pages, the next ones what an interruption or a
// pressure episode mapped and no longer uses. A failure is logged, not fatal: the agent only
// holds more memory.
func Run(ctx context.Context, clk clock.WithTicker, first, every time.Duration, release func() (Result, error)) {
	logger := klog.FromContext(ctx)
	once := func() {
		r, err := release()
		if err != nil {
			logger.Error(err, "Releasing the executable's unused pages failed")
			return
		}
		logger.V(2).Info("Released the executable's pages", "mappings", r.Mappings, "bytes", r.Bytes, "residentBefore", r.Resident)
	}
	t := clk.NewTimer(first)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return
	case <-t.C():
	}
	once()
	if every <= 0 {
		return
	}
	ticker := clk.NewTicker(every)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
			once()
		}
	}
}
