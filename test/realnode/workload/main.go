// Command workload is the process of the real node's test pods: it records what happens to it
// in files under -out (a hostPath the test reads), so that the test sees the moments from inside
// the container rather than from the API.
//
//	workload term  -out DIR [-checkpoint-after D] [-exit-after D]
//	workload alloc -out DIR -rate MiB/s -max MiB [-keep-on-term] [-step MiB] [-start-after D]
//	workload write -out DIR -file PATH -rate MiB/s -max MiB
//	workload sawtooth -out DIR -rate MiB/s -max MiB [-hold D]
//	workload jitter -out DIR -base MiB -amp MiB
//	workload pagecache -out DIR -file PATH -size MiB -hold D -every D
//
// Every mode writes DIR/started at start and DIR/alive (the time, rewritten every 50 ms) while it
// runs: the last alive time is when the process stopped, within 50 ms, which for a process that
// never exits on its own is the kubelet's SIGKILL. On SIGTERM it writes DIR/sigterm with the time
// it arrived. term then writes DIR/checkpoint (the time, fsynced) -checkpoint-after later and
// exits -exit-after after SIGTERM (never, when 0: it waits for the SIGKILL). alloc allocates
// and touches -rate MiB of memory a second up to -max, and write appends -rate MiB a second to
// -file up to -max; both stop at SIGTERM and exit a second later, except alloc with
// -keep-on-term, which records the SIGTERM and goes on allocating until it is killed (a pod
// deleted by a rollout that holds its memory for its whole grace). The healthy workloads of the
// pressure series (issue 47) run until killed and record no SIGTERM of their own besides it:
// sawtooth touches -rate MiB of anonymous memory a second up to -max, holds it -hold, then frees
// it at once (madvise DONTNEED: a garbage collector's sawtooth), again and again; jitter holds
// -base MiB and every 250 ms takes or gives back up to -amp MiB around it; pagecache writes a
// -size MiB file, reads it twice (its pages active, which the kubelet counts as used), holds it
// -hold, deletes it (the pages freed), and starts again every -every. Times are Unix milliseconds.
package main

import (
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: workload term|alloc|write [flags]")
		os.Exit(2)
	}
	mode := os.Args[1]
	fs := flag.NewFlagSet(mode, flag.ExitOnError)
	out := fs.String("out", "", "folder for the record files (created)")
	checkpointAfter := fs.Duration("checkpoint-after", 0, "term: write the checkpoint this long after SIGTERM")
	exitAfter := fs.Duration("exit-after", 0, "term: exit this long after SIGTERM (0: never)")
	rate := fs.Int("rate", 50, "alloc, write: MiB a second")
	maxMiB := fs.Int("max", 512, "alloc, write: MiB in all")
	file := fs.String("file", "", "write: the file to fill")
	keepOnTerm := fs.Bool("keep-on-term", false, "alloc: go on allocating after SIGTERM, until killed")
	hold := fs.Duration("hold", 0, "sawtooth, pagecache: how long to hold the memory before freeing it")
	base := fs.Int("base", 256, "jitter: MiB held")
	amp := fs.Int("amp", 32, "jitter: MiB taken or given back around -base")
	size := fs.Int("size", 1024, "pagecache: the file's MiB")
	every := fs.Duration("every", 3*time.Minute, "pagecache: how often to start again")
	startAfter := fs.Duration("start-after", 0, "alloc: wait this long before allocating")
	stepMiB := fs.Int("step", 0, "alloc: take this much at once when it starts, then -rate a second")
	_ = fs.Parse(os.Args[2:])
	if *out == "" {
		fmt.Fprintln(os.Stderr, "workload: -out is required")
		os.Exit(2)
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "workload:", err)
		os.Exit(1)
	}
	record := func(name string) {
		path := filepath.Join(*out, name)
		f, err := os.Create(path + ".tmp")
		if err == nil {
			_, err = f.WriteString(strconv.FormatInt(time.Now().UnixMilli(), 10))
			if err == nil {
				err = f.Sync()
			}
			f.Close()
		}
		if err == nil {
			err = os.Rename(path+".tmp", path)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "workload: recording", name+":", err)
		}
	}
	record("started")
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	alive := time.NewTicker(50 * time.Millisecond)
	defer alive.Stop()

	var step <-chan time.Time
	var fill func() bool // one step of work; false when done
	switch mode {
	case "term":
	case "alloc":
		var held [][]byte
		begin := time.Now().Add(*startAfter)
		fill = func() bool {
			if len(held) >= *maxMiB {
				return false
			}
			if time.Now().Before(begin) {
				return true
			}
			n := max(*rate/10, 1)
			if len(held) == 0 && *stepMiB > 0 {
				n = *stepMiB
			}
			for range n {
				b := make([]byte, 1<<20)
				for i := 0; i < len(b); i += 4096 {
					b[i] = 1 // touch every page: resident, in the working set
				}
				held = append(held, b)
			}
			return true
		}
	case "write":
		f, err := os.OpenFile(*file, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			fmt.Fprintln(os.Stderr, "workload:", err)
			os.Exit(1)
		}
		chunk := make([]byte, 1<<20)
		for i := range chunk {
			chunk[i] = byte(i)
		}
		written := 0
		fill = func() bool {
			if written >= *maxMiB {
				return false
			}
			for range max(*rate/10, 1) {
				if _, err := f.Write(chunk); err != nil {
					fmt.Fprintln(os.Stderr, "workload:", err)
					return false
				}
				written++
			}
			_ = f.Sync()
			return true
		}
	case "sawtooth":
		region := mapMiB(*maxMiB)
		touched := 0
		var heldSince time.Time
		fill = func() bool {
			switch {
			case touched < *maxMiB:
				n := min(max(*rate/10, 1), *maxMiB-touched)
				touchMiB(region, touched, n)
				touched += n
				heldSince = time.Now()
			case time.Since(heldSince) >= *hold:
				freeMiB(region, 0, touched)
				touched = 0
			}
			return true
		}
	case "jitter":
		region := mapMiB(*base + *amp)
		touchMiB(region, 0, *base)
		held := *base
		rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 47))
		var last time.Time
		fill = func() bool {
			if time.Since(last) < 250*time.Millisecond {
				return true
			}
			last = time.Now()
			want := *base - *amp + rng.IntN(2**amp+1)
			switch {
			case want > held:
				touchMiB(region, held, want-held)
			case want < held:
				freeMiB(region, want, held-want)
			}
			held = want
			return true
		}
	case "pagecache":
		var started, heldSince time.Time
		phase := 0 // 0 idle, 1 held
		fill = func() bool {
			switch {
			case phase == 0 && (started.IsZero() || time.Since(started) >= *every):
				started = time.Now()
				if err := cacheFile(*file, *size); err != nil {
					fmt.Fprintln(os.Stderr, "workload:", err)
					return false
				}
				heldSince, phase = time.Now(), 1
			case phase == 1 && time.Since(heldSince) >= *hold:
				_ = os.Remove(*file)
				phase = 0
			}
			return true
		}
	default:
		fmt.Fprintln(os.Stderr, "workload: unknown mode", mode)
		os.Exit(2)
	}
	if fill != nil {
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		step = t.C
	}
	var checkpoint, exit <-chan time.Time
	for {
		select {
		case <-alive.C:
			record("alive")
		case <-step:
			if !fill() {
				step = nil
			}
		case <-term:
			record("sigterm")
			if *keepOnTerm && mode == "alloc" {
				continue
			}
			step = nil
			switch {
			case mode != "term":
				exit = time.After(time.Second)
			default:
				if *checkpointAfter > 0 {
					checkpoint = time.After(*checkpointAfter)
				}
				if *exitAfter > 0 {
					exit = time.After(*exitAfter)
				}
			}
		case <-checkpoint:
			record("checkpoint")
		case <-exit:
			record("exited")
			os.Exit(0)
		}
	}
}

// mapMiB maps n MiB of anonymous memory, none of it resident until touched.
func mapMiB(n int) []byte {
	b, err := syscall.Mmap(-1, 0, max(n, 1)<<20, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		fmt.Fprintln(os.Stderr, "workload: mmap:", err)
		os.Exit(1)
	}
	return b
}

// touchMiB makes n MiB of region from MiB from resident (every page written).
func touchMiB(region []byte, from, n int) {
	for i := from << 20; i < (from+n)<<20 && i < len(region); i += 4096 {
		region[i] = 1
	}
}

// freeMiB gives n MiB of region from MiB from back to the kernel at once.
func freeMiB(region []byte, from, n int) {
	end := min((from+n)<<20, len(region))
	if err := syscall.Madvise(region[from<<20:end], syscall.MADV_DONTNEED); err != nil {
		fmt.Fprintln(os.Stderr, "workload: madvise:", err)
	}
}

// cacheFile writes a file of n MiB at path and reads it twice: the second read moves its pages
// to the active list, which the kubelet's working set counts.
func cacheFile(path string, n int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	chunk := make([]byte, 1<<20)
	for i := range chunk {
		chunk[i] = byte(i * 7)
	}
	for range n {
		if _, err := f.Write(chunk); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	for range 2 {
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			f.Close()
			return err
		}
		if _, err := io.Copy(io.Discard, f); err != nil {
			f.Close()
			return err
		}
	}
	return f.Close()
}
