package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/reprieve-dev/reprieve/test/testenv"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat (100 on Linux).
const clockTicks = 100

// procStat is what /proc says of one process.
type procStat struct {
	RSS, HWM uint64 // VmRSS and VmHWM, bytes
	// Anon and File split RSS: the heap and stacks, and the binary's own pages (clean, so the
	// kernel can drop and re-read them).
	Anon, File uint64
	CPU        time.Duration // user + system time so far
}

// readProc reads /proc/<pid>/status and /proc/<pid>/stat.
func readProc(pid int) (procStat, error) {
	var st procStat
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, fmt.Errorf("reading the status of process %d: %w", pid, err)
	}
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) < 1 {
			continue
		}
		n, err := strconv.ParseUint(f[0], 10, 64)
		if err != nil {
			continue
		}
		switch k {
		case "VmRSS":
			st.RSS = n << 10
		case "VmHWM":
			st.HWM = n << 10
		case "RssAnon":
			st.Anon = n << 10
		case "RssFile":
			st.File = n << 10
		}
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return st, fmt.Errorf("reading the stat of process %d: %w", pid, err)
	}
	// The command name, in parentheses, may hold spaces: fields count from after it.
	_, rest, ok := strings.Cut(string(stat), ") ")
	if !ok {
		return st, fmt.Errorf("parsing the stat of process %d", pid)
	}
	f := strings.Fields(rest)
	if len(f) < 13 {
		return st, fmt.Errorf("parsing the stat of process %d: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return st, fmt.Errorf("parsing the CPU times of process %d", pid)
	}
	st.CPU = time.Duration(utime+stime) * time.Second / clockTicks
	return st, nil
}

// machine describes where the figures were taken.
type machine struct {
	CPU                                 string
	Cores                               int
	Memory                              string
	Go, APIServer, Etcd, Kwok, IMDSMock string
	Date                                string
}

func describeMachine(ctx context.Context) (machine, error) {
	m := machine{Cores: runtime.NumCPU(), Go: runtime.Version(), Date: time.Now().UTC().Format("2006-01-02")}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
				if kb, err := strconv.ParseUint(f[1], 10, 64); err == nil {
					m.Memory = fmt.Sprintf("%.0f GiB", float64(kb)/(1<<20))
				}
			}
		}
	}
	if out, err := exec.CommandContext(ctx, "go", "env", "GOVERSION").Output(); err == nil {
		m.Go = strings.TrimSpace(string(out))
	}
	dir, err := testenv.ToolsBin()
	if err != nil {
		return m, err
	}
	for name, dst := range map[string]*string{
		testenv.KubeAPIServerBin: &m.APIServer, testenv.EtcdBin: &m.Etcd,
		testenv.KwokBin: &m.Kwok, testenv.IMDSMockBin: &m.IMDSMock,
	} {
		if b, err := os.ReadFile(dir + "/" + name + ".version"); err == nil {
			*dst = strings.TrimSpace(string(b))
		} else {
			*dst = "unknown"
		}
	}
	return m, nil
}
