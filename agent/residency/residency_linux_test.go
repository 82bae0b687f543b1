package residency

import (
	"encoding/binary"
	"errors"
	"os"
	"runtime"
	"testing"
)

// marker is in the executable's writable data (initialised, so not .bss): Release must leave
// what the process wrote there.
var marker = 1

// selfMappings is the test binary's path and its mappings now.
func selfMappings(t *testing.T) (exe string, maps []Mapping) {
	t.Helper()
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if maps, err = ParseSmaps(f); err != nil {
		t.Fatal(err)
	}
	return exe, maps
}

func residentOfExecutable(t *testing.T) (releasable, written uint64) {
	t.Helper()
	exe, maps := selfMappings(t)
	for _, m := range maps {
		switch {
		case m.Releasable(exe):
			releasable += m.Rss
		case m.Path == exe:
			written += m.Anonymous
		}
	}
	return releasable, written
}

func TestReleaseUnmapsOnlyTheExecutablesReadOnlyPages(t *testing.T) {
	marker = 2
	before, writtenBefore := residentOfExecutable(t)
	r, err := Release()
	if err != nil {
		t.Fatal(err)
	}
	after, writtenAfter := residentOfExecutable(t)
	t.Logf("released %d mappings of %d bytes; resident %d before (Release saw %d), %d after", r.Mappings, r.Bytes, before, r.Resident, after)
	if r.Mappings < 2 {
		t.Errorf("released %d mappings, want at least the code and the read-only data", r.Mappings)
	}
	// What was touched between the release and the second read (this test, smaps' parsing, the
	// runtime) is mapped again, with the kernel's fault-around (64 KiB around each fault): less
	// than start-up mapped, not nothing (a test binary is small: 3.1 MiB resident, 1.7 after).
	if after > before*9/10 {
		t.Errorf("the executable's read-only pages: %d bytes resident after Release, %d before: want at most nine tenths", after, before)
	}
	if writtenAfter < writtenBefore/2 {
		t.Errorf("the executable's written pages went from %d to %d bytes: a writable mapping was released", writtenBefore, writtenAfter)
	}
	runtime.GC() // the collector reads the type and pointer tables Release unmapped
	if marker != 2 {
		t.Fatalf("marker = %d after Release, want 2: a written page was reset to the file's content", marker)
	}
}

// activeOfExecutable counts the pages of the executable's releasable mappings that are mapped,
// and those of them on the active list, from /proc/self/pagemap and /proc/kpageflags
// (Documentation/admin-guide/mm/pagemap.rst: bit 63 present, bits 0-54 the frame; flag 6
// ACTIVE). Reading frame numbers takes CAP_SYS_ADMIN: without it the test is skipped.
func activeOfExecutable(t *testing.T) (mapped, active int) {
	t.Helper()
	exe, maps := selfMappings(t)
	pagemap, err := os.Open("/proc/self/pagemap")
	if err != nil {
		t.Skipf("no pagemap: %v", err)
	}
	defer pagemap.Close()
	flags, err := os.Open("/proc/kpageflags")
	if err != nil {
		t.Skipf("no kpageflags (needs root): %v", err)
	}
	defer flags.Close()
	const page = 4096
	b := make([]byte, 8)
	for _, m := range maps {
		if !m.Releasable(exe) {
			continue
		}
		for a := m.Start; a < m.End; a += page {
			if _, err := pagemap.ReadAt(b, int64(a/page*8)); err != nil {
				t.Fatal(err)
			}
			e := binary.LittleEndian.Uint64(b)
			if e>>63 == 0 {
				continue
			}
			pfn := e & (1<<55 - 1)
			if pfn == 0 {
				t.Skip("pagemap hides frame numbers (needs CAP_SYS_ADMIN)")
			}
			if _, err := flags.ReadAt(b, int64(pfn*8)); err != nil {
				if errors.Is(err, os.ErrPermission) {
					t.Skipf("kpageflags: %v", err)
				}
				t.Fatal(err)
			}
			mapped++
			if binary.LittleEndian.Uint64(b)>>6&1 == 1 {
				active++
			}
		}
	}
	return mapped, active
}

// TestReleaseLeavesThePagesInactive: the kubelet's working set (usage less inactive_file) must
// lose the pages, not only the RSS. Unmapping alone leaves every page where it was, on the
// active list (304 of 304 pages mapped again in this test binary were active); MADV_COLD first
// moves them to the inactive list, where the ones mapped again stay until reclaim finds them
// referenced.
func TestReleaseLeavesThePagesInactive(t *testing.T) {
	if _, err := Release(); err != nil {
		t.Fatal(err)
	}
	mapped, active := activeOfExecutable(t)
	t.Logf("after Release: %d pages of the executable mapped again, %d of them active", mapped, active)
	if mapped == 0 {
		t.Fatal("no page of the executable mapped: the test reads the wrong mappings")
	}
	if active*2 > mapped {
		t.Errorf("%d of the %d pages mapped again are active: the released pages stayed on the active list", active, mapped)
	}
}

// BenchmarkRelease is one release of this test binary's pages (smaps read, parsed, madvise).
func BenchmarkRelease(b *testing.B) {
	for b.Loop() {
		if _, err := Release(); err != nil {
			b.Fatal(err)
		}
	}
}
