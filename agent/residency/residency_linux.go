package residency

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Release unmaps the pages of the running executable's read-only mappings (its code, read-only
// data and pclntab) with madvise(MADV_COLD) and madvise(MADV_DONTNEED). It touches no writable
// mapping and no page the process wrote. The pages stay in the page cache: the call frees no
// memory of the node by itself (the cgroup's usage stays); it stops the process mapping, and
// counting in its RSS, pages it does not use, and puts them on the inactive list, the first
// the kernel drops under pressure.
func Release() (Result, error) {
	var r Result
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return r, fmt.Errorf("finding the executable: %w", err)
	}
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return r, fmt.Errorf("reading the process's mappings: %w", err)
	}
	maps, err := ParseSmaps(f)
	_ = f.Close()
	if err != nil {
		return r, err
	}
	for _, m := range maps {
		if !m.Releasable(exe) || m.End == m.Start {
			continue
		}
		// MADV_COLD first, while the pages are still mapped (it walks the page table): it clears
		// their accessed bits and moves them to the inactive list (mm/madvise.c,
		// madvise_cold_or_pageout_pte_range), where the kubelet's working set (usage less
		// inactive_file) no longer counts them and reclaim looks first; a page the agent uses
		// again is referenced again, and reclaim moves it back (mm/vmscan.c,
		// folio_check_references). Without it, unmapping would mark each recently used page
		// accessed (mm/memory.c, zap_present_ptes), and the working set would not change. Older
		// kernels (before 5.4) refuse MADV_COLD with EINVAL: then only the unmapping is done.
		if errno := madvise(m, unix.MADV_COLD); errno != 0 && errno != unix.EINVAL {
			return r, fmt.Errorf("marking %x-%x (%s) of %s cold: %w", m.Start, m.End, m.Perms, exe, errno)
		}
		if errno := madvise(m, unix.MADV_DONTNEED); errno != 0 {
			return r, fmt.Errorf("releasing %x-%x (%s) of %s: %w", m.Start, m.End, m.Perms, exe, errno)
		}
		r.Mappings++
		r.Bytes += m.End - m.Start
		r.Resident += m.Rss
	}
	return r, nil
}

// madvise is the raw call: unix.Madvise takes a []byte, which a mapping the Go runtime did not
// allocate cannot become without unsafe.
func madvise(m Mapping, advice int) unix.Errno {
	_, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(m.Start), uintptr(m.End-m.Start), uintptr(advice))
	return errno
}
