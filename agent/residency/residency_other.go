//go:build !linux

package residency

import "errors"

// Release is Linux-only (madvise on the mappings /proc/self/smaps lists).
func Release() (Result, error) {
	return Result{}, errors.New("releasing the executable's pages: Linux only")
}
