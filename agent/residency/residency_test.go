package residency

import (
	"context"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
	clocktesting "k8s.io/utils/clock/testing"
)

func TestParseSmapsAndReleasable(t *testing.T) {
	f, err := os.Open("testdata/smaps")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	maps, err := ParseSmaps(f)
	if err != nil {
		t.Fatal(err)
	}
	const exe = "/usr/local/bin/reprieve"
	type want struct {
		start      uint64
		perms      string
		rss, anon  uint64
		releasable bool
	}
	wants := []want{
		{0x400000, "r-xp", 10192 << 10, 0, true},          // code
		{0x10b4000, "r--p", 11168 << 10, 0, true},         // rodata and pclntab
		{0x1e6c000, "rw-p", 468 << 10, 112 << 10, false},  // .data: written
		{0x1f01000, "rw-p", 136 << 10, 136 << 10, false},  // .bss: anonymous
		{0x7f70d8000000, "r--p", 4 << 10, 4 << 10, false}, // another file
		{0x7f70d8100000, "r--p", 8 << 10, 8 << 10, false}, // read-only now, but with private copies (RELRO)
		{0x7f70d8200000, "r--s", 16 << 10, 0, false},      // shared
		{0x7f70d8acf000, "r-xp", 8 << 10, 0, false},       // vdso
		{0x7f70d8300000, "r-xp", 128 << 10, 0, false},     // a library
	}
	if len(maps) != len(wants) {
		t.Fatalf("parsed %d mappings, want %d: %+v", len(maps), len(wants), maps)
	}
	for i, w := range wants {
		m := maps[i]
		if m.Start != w.start || m.Perms != w.perms || m.Rss != w.rss || m.Anonymous != w.anon {
			t.Errorf("mapping %d = %+v, want start %x perms %s rss %d anonymous %d", i, m, w.start, w.perms, w.rss, w.anon)
		}
		if got := m.Releasable(exe); got != w.releasable {
			t.Errorf("mapping %d (%x %s %s): releasable %v, want %v", i, m.Start, m.Perms, m.Path, got, w.releasable)
		}
	}
	if maps[0].Releasable("") {
		t.Error("a mapping is releasable for an empty executable path")
	}
}

func TestParseSmapsErrors(t *testing.T) {
	for name, in := range map[string]string{
		"field first":    "Rss: 4 kB\n",
		"no kB":          "00400000-00401000 r-xp 00000000 fe:00 1 /bin/x\nRss: 4\n",
		"bad number":     "00400000-00401000 r-xp 00000000 fe:00 1 /bin/x\nRss: four kB\n",
		"bad range":      "00400000 r-xp 00000000 fe:00 1 /bin/x\n",
		"bad address":    "0040zz00-00401000 r-xp 00000000 fe:00 1 /bin/x\n",
		"range reversed": "00401000-00400000 r-xp 00000000 fe:00 1 /bin/x\n",
		"bad inode":      "00400000-00401000 r-xp 00000000 fe:00 x /bin/x\n",
		"short header":   "00400000-00401000 r-xp 00000000\n",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := ParseSmaps(strings.NewReader(in)); err == nil || !strings.Contains(err.Error(), "parsing smaps") {
				t.Fatalf("ParseSmaps(%q) = %v, want a parsing error", in, err)
			}
		})
	}
}

func TestRunReleasesAfterFirstThenEvery(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Unix(1000, 0))
	var calls atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, clk, 30*time.Second, 10*time.Minute, func() (Result, error) { calls.Add(1); return Result{}, nil })
	}()
	step := func(d time.Duration, want int32) {
		t.Helper()
		// Polls for Run to arm its timer or ticker, and for its call: not for time to pass.
		_ = wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 5*time.Second, true,
			func(context.Context) (bool, error) { return clk.HasWaiters(), nil })
		clk.Step(d)
		_ = wait.PollUntilContextTimeout(context.Background(), time.Millisecond, 5*time.Second, true,
			func(context.Context) (bool, error) { return calls.Load() == want, nil })
		if got := calls.Load(); got != want {
			t.Fatalf("after stepping %v: %d releases, want %d", d, got, want)
		}
	}
	step(29*time.Second, 0)
	step(time.Second, 1)
	step(9*time.Minute, 1)
	step(time.Minute, 2)
	step(10*time.Minute, 3)
	cancel()
	<-done
}
