package agent

import "runtime/debug"

// buildRevision is the VCS revision the Go toolchain recorded in the binary (vcs.revision, with
// "-dirty" for a modified tree), or "unknown" for a build without it (-buildvcs=false, or a
// source tree without its .git).
func buildRevision() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	rev, dirty := "", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "unknown"
	}
	if dirty {
		rev += "-dirty"
	}
	return rev
}
