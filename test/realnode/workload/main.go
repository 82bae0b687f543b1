// Command workload is the process of the real node's test pods: it records what happens to it
// in files under -out (a hostPath the test reads), so that the test sees the moments from inside
// the container rather than from the API.
//
//	workload term  -out DIR [-checkpoint-after D] [-exit-after D]
//	workload alloc -out DIR -rate MiB/s -max MiB [-keep-on-term]
//	workload write -out DIR -file PATH -rate MiB/s -max MiB
//
// Every mode writes DIR/started at start and DIR/alive (the time, rewritten every 50 ms) while it
// runs: the last alive time is when the process stopped, within 50 ms, which for a process that
// never exits on its own is the kubelet's SIGKILL. On SIGTERM it writes DIR/sigterm with the time
// it arrived. term then writes DIR/checkpoint (the time, fsynced) -checkpoint-after later and
// exits -exit-after after SIGTERM (never, when 0: it waits for the SIGKILL). alloc allocates
// and touches -rate MiB of memory a second up to -max, and write appends -rate MiB a second to
// -file up to -max; both stop at SIGTERM and exit a second later, except alloc with
// -keep-on-term, which records the SIGTERM and goes on allocating until it is killed (a pod
// deleted by a rollout that holds its memory for its whole grace). Times are Unix milliseconds.
package main

import (
	"flag"
	"fmt"
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
		fill = func() bool {
			if len(held) >= *maxMiB {
				return false
			}
			for range max(*rate/10, 1) {
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
