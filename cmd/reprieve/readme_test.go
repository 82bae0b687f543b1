package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/agent/config"
)

// readmeFlagRow is a row of a documentation table of flags: the flags of its first cell and the
// defaults (backticked, comma-separated) of its second.
var (
	readmeFlagRow = regexp.MustCompile("(?m)^\\| (`--[a-z0-9-]+`(?:, `--[a-z0-9-]+`)*) \\| ([^|]*) \\|")
	backticked    = regexp.MustCompile("`([^`]*)`")
)

// TestReadmeFlagDefaults (issue 49, item 3): every flag in a documents' table of flags (the
// README's, docs/*.md's) is a flag of the agent that --help shows (no hidden test-only flag), and
// every default it states in backticks is the flag's own (durations compared as durations). A
// default in words ("unset", "$NODE_NAME") is for a flag whose default is empty.
func TestReadmeFlagDefaults(t *testing.T) {
	cfg := config.DefaultConfig()
	fs := agentFlagSet(&cfg)
	files := []string{"../../README.md", "../../docs/install.md", "../../docs/migrating-from-nth.md", "../../docs/operations.md"}
	rows := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range readmeFlagRow.FindAllStringSubmatch(string(b), -1) {
			var names []string
			for _, n := range backticked.FindAllStringSubmatch(m[1], -1) {
				names = append(names, strings.TrimPrefix(n[1], "--"))
			}
			var defaults []string
			for _, d := range backticked.FindAllStringSubmatch(m[2], -1) {
				defaults = append(defaults, d[1])
			}
			rows++
			for i, name := range names {
				fl := fs.Lookup(name)
				if fl == nil {
					t.Errorf("%s: the table names --%s, which is not a flag of the agent", f, name)
					continue
				}
				if fl.Hidden {
					t.Errorf("%s: the table names --%s, a hidden flag that only tests change", f, name)
				}
				if len(defaults) != len(names) {
					if fl.DefValue != "" && fl.DefValue != "false" && fl.DefValue != "0" && fl.DefValue != "0s" && fl.DefValue != "[]" && len(defaults) == 0 {
						t.Errorf("%s: --%s's default %q is not stated", f, name, fl.DefValue)
					}
					continue
				}
				if !sameDefault(defaults[i], fl.DefValue) {
					t.Errorf("%s: --%s's default is given as %q; the flag's is %q", f, name, defaults[i], fl.DefValue)
				}
			}
		}
	}
	if rows < 20 {
		t.Errorf("%d rows of flags found: the parse is wrong", rows)
	}
}

// sameDefault compares a documented default with a flag's: equal strings, equal durations, or
// an empty flag default documented as an environment variable or in words.
func sameDefault(doc, flag string) bool {
	if doc == flag {
		return true
	}
	if a, err := time.ParseDuration(doc); err == nil {
		if b, err := time.ParseDuration(flag); err == nil {
			return a == b
		}
	}
	return flag == "" && (strings.HasPrefix(doc, "$") || doc == "")
}
