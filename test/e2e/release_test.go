package e2e

import (
	"debug/elf"
	"os/exec"
	"strings"
	"testing"

	"github.com/reprieve-dev/reprieve/test/scenario"
)

// TestReleaseBinary: the binary every e2e test runs is built as the Makefile's build target and
// the Dockerfile build it (the same flags in all three), it is static (the distroless static
// image has no C library, so no loader and no shared library), and it runs.
func TestReleaseBinary(t *testing.T) {
	t.Parallel()
	for _, f := range []string{"Makefile", "Dockerfile"} {
		b := readRepoFile(t, f)
		for _, want := range scenario.ReleaseBuild {
			if !strings.Contains(string(b), want) {
				t.Errorf("%s does not build with %s, as the tests' binary is built", f, want)
			}
		}
	}
	f, err := elf.Open(reprieveBin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Error("the binary asks for a dynamic loader (PT_INTERP): it is not static")
		}
	}
	if libs, err := f.ImportedLibraries(); err != nil || len(libs) > 0 {
		t.Errorf("the binary links %v (%v): it is not static", libs, err)
	}
	out, err := exec.Command(reprieveBin, "version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "reprieve "+scenario.ReleaseVersion+" ") {
		t.Errorf("reprieve version: %q, %v; want the version baked in", out, err)
	}
}
