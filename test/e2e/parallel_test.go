package e2e

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestKeptApartListed holds the parallel suite to its documentation: every top-level test of
// this package whose first statement is not t.Parallel() runs alone, one after another, before
// the parallel phase, so it costs its whole duration of the package's wall time. Each must be
// named in test/README.md's "Kept apart" table with its reason, and every name in that table
// must be such a test. Tests added beside the parallel work without t.Parallel() made 16 of them
// serial for no reason, and the package took 15 minutes in CI instead of 6.
func TestKeptApartListed(t *testing.T) {
	t.Parallel()
	serial := serialTests(t)
	listed := keptApartInREADME(t)
	var unlisted, stale []string
	for name := range serial {
		if !listed[name] {
			unlisted = append(unlisted, name)
		}
	}
	for name := range listed {
		if !serial[name] {
			stale = append(stale, name)
		}
	}
	sort.Strings(unlisted)
	sort.Strings(stale)
	if len(unlisted) > 0 {
		t.Errorf("tests that do not call t.Parallel() first and are not in test/README.md's kept-apart table (call t.Parallel(), or list them with the reason): %s", strings.Join(unlisted, ", "))
	}
	if len(stale) > 0 {
		t.Errorf("test/README.md keeps apart tests that are parallel or gone: %s", strings.Join(stale, ", "))
	}
	if len(serial) == 0 || len(listed) == 0 {
		t.Fatalf("found %d serial tests and %d listed: the parse is broken", len(serial), len(listed))
	}
}

// serialTests returns the top-level Test functions of this package's files whose body does not
// begin with t.Parallel().
func serialTests(t *testing.T) map[string]bool {
	t.Helper()
	files, err := filepath.Glob("*_test.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	out := map[string]bool{}
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatalf("parsing %s: %v", f, err)
		}
		for _, d := range file.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Name.Name == "TestMain" {
				continue
			}
			if !startsParallel(fn.Body) {
				out[fn.Name.Name] = true
			}
		}
	}
	return out
}

func startsParallel(body *ast.BlockStmt) bool {
	if body == nil || len(body.List) == 0 {
		return false
	}
	es, ok := body.List[0].(*ast.ExprStmt)
	if !ok {
		return false
	}
	call, ok := es.X.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "Parallel"
}

var testName = regexp.MustCompile("`(Test[A-Za-z0-9_]+)`")

// keptApartInREADME returns the test names in the first column of the table that follows the
// line "Kept apart" in test/README.md.
func keptApartInREADME(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case strings.HasPrefix(line, "Kept apart"):
			in = true
		case in && strings.HasPrefix(line, "|"):
			cols := strings.SplitN(line, "|", 3)
			for _, m := range testName.FindAllStringSubmatch(cols[1], -1) {
				out[m[1]] = true
			}
		case in && len(out) > 0 && !strings.HasPrefix(line, "|"):
			return out
		}
	}
	return out
}

// TestCPUBound runs the tests that take both cores and measure no time side by side with each
// other, in the serial phase, apart from every test that measures time: the chart's helm runs,
// the two tests that start a second kube-apiserver on the shared etcd, and the migration guide's
// switch-over on a control plane of its own (helm --wait, most of its minute spent waiting for
// controllers, beside the helm runs here instead of after them). One after another they took
// about a minute of the serial phase; beside the timed tests of the parallel phase they delayed
// a deadline-bound eviction past the agent's lead (test/README.md, "Kept apart").
func TestCPUBound(t *testing.T) {
	for _, c := range []struct {
		name string
		test func(*testing.T)
	}{
		{"ChartConventions", testChartConventions},
		{"ChartLint", testChartLint},
		{"ChartNotes", testChartNotes},
		{"ManifestsRendered", testManifestsRendered},
		{"ChartRendersApplyServerDryRun", testChartRendersApplyServerDryRun},
		{"ChartValues", testChartValues},
		{"ChartGitOps", testChartGitOps},
		{"ChartNotesPlacement", testChartNotesPlacement},
		{"ChartGuardPlacementValues", testChartGuardPlacementValues},
		{"ChartSelectionValues", testChartSelectionValues},
		{"EvictionGuardChartRender", testEvictionGuardChartRender},
		{"EvictionGuardChartKeepsItsKeyPair", testEvictionGuardChartKeepsItsKeyPair},
		{"EvictionGuardChartPodMonitor", testEvictionGuardChartPodMonitor},
		{"EvictionGuardChartUserCertificate", testEvictionGuardChartUserCertificate},
		{"ChartNoticeEndpoint", testChartNoticeEndpoint},
		{"ChartNodeConditionValues", testChartNodeConditionValues},
		{"EvictionGuardClientCertificate", testEvictionGuardClientCertificate},
		{"NodeLifecycleConditions", testNodeLifecycleConditions},
		{"MigrationGuideSwitchOver", testMigrationGuideSwitchOver},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.test(t)
		})
	}
}
