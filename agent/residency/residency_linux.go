package residency

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// Release unmaps the pages of the running executable's read-only mappings (its code, read-only
// data and pclntab) with madvise(MADV_DONTNEED). It touches no writable mapping and no page the
// process wrote. The pages stay in the page cache: the call frees no memory of the node by
// itself, it only stops the process mapping, and counting, pages it does not use; those are
// then the first the kernel can drop under pressure.
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
		// The raw call: unix.Madvise takes a []byte, which the address of a mapping the Go
		// runtime did not allocate cannot become without unsafe.
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, uintptr(m.Start), uintptr(m.End-m.Start), unix.MADV_DONTNEED); errno != 0 {
			return r, fmt.Errorf("releasing %x-%x (%s) of %s: %w", m.Start, m.End, m.Perms, exe, errno)
		}
		r.Mappings++
		r.Bytes += m.End - m.Start
		r.Resident += m.Rss
	}
	return r, nil
}
