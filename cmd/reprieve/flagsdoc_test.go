package main

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/reprieve-dev/reprieve/agent/config"
)

var update = flag.Bool("update", false, "rewrite docs/flags.md from the binary's flags")

const flagsDocPath = "../../docs/flags.md"

// flagsDoc is docs/flags.md: the binary's own --help, so that the reference cannot drift.
func flagsDoc() string {
	cfg := config.DefaultConfig()
	fs := agentFlagSet(&cfg)
	var b strings.Builder
	b.WriteString("# Flags\n\n")
	b.WriteString("Generated from `reprieve --help` by `go test ./cmd/reprieve -run TestFlagsDoc -update`; a test fails\n")
	b.WriteString("when this file and the binary disagree. `reprieve plan` and `reprieve doctor` take the same flags,\n")
	b.WriteString("plus their own (`reprieve plan --help`). The README's table explains the main ones. Two flags that\n")
	b.WriteString("only tests change, `--" + strings.Join(testOnlyFlags, "` and `--") + "`, are hidden\n")
	b.WriteString("([test/README.md](../test/README.md)).\n\n")
	b.WriteString("```\n")
	b.WriteString(usageHeader)
	b.WriteString("\n")
	b.WriteString(fs.FlagUsages())
	b.WriteString("```\n")
	return b.String()
}

func TestFlagsDoc(t *testing.T) {
	want := flagsDoc()
	if *update {
		if err := os.WriteFile(flagsDocPath, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(flagsDocPath)
	if err != nil {
		t.Fatalf("%v (run go test ./cmd/reprieve -run TestFlagsDoc -update)", err)
	}
	if string(got) != want {
		t.Errorf("docs/flags.md is stale: run go test ./cmd/reprieve -run TestFlagsDoc -update")
	}
}
