package residency

import (
	"os"
	"runtime"
	"testing"
)

// marker is in the executable's writable data (initialised, so not .bss): Release must leave
// what the process wrote there.
var marker = 1

func residentOfExecutable(t *testing.T) (releasable, written uint64) {
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
	maps, err := ParseSmaps(f)
	if err != nil {
		t.Fatal(err)
	}
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
	// than start-up mapped, not nothing (a test binary is small: 3.1 MiB resident, 1.8 after).
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

// BenchmarkRelease is one release of this test binary's pages (smaps read, parsed, madvise).
func BenchmarkRelease(b *testing.B) {
	for b.Loop() {
		if _, err := Release(); err != nil {
			b.Fatal(err)
		}
	}
}
