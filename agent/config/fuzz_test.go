package config

import (
	"testing"

	"github.com/reprieve-dev/reprieve/agent/evict"
)

// FuzzParseTaint: a taint that parses is one the API server accepts, and printing it back gives
// a string that parses to the same taint.
func FuzzParseTaint(f *testing.F) {
	for _, s := range []string{"cloud=spot:NoExecute", "reprieve.io/memory-pressure:NoSchedule", "a=b:PreferNoSchedule", "=:", "key", "k=v:Never", "example.com/x=y=z:NoExecute", "k:NoExecute:extra"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		taint, err := ParseTaint(s)
		if err != nil {
			return
		}
		if taint.Key == "" {
			t.Errorf("%q parsed with an empty key", s)
		}
		again, err := ParseTaint(evict.TaintString(taint))
		if err != nil || again != taint {
			t.Errorf("%q parsed to %+v, printed as %q, parsed again to %+v, %v", s, taint, evict.TaintString(taint), again, err)
		}
	})
}
