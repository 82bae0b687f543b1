package deploy

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// docFiles are the files a user reads to install and run reprieve: the README, docs/ (but the
// generated benchmark figures), the chart's values and templates (NOTES.txt among them), and the
// plain Prometheus objects. Paths are relative to this package.
func docFiles(t *testing.T) []string {
	t.Helper()
	var out []string
	for _, g := range []string{"../README.md", "../docs/*.md", "../test/README.md", "chart/reprieve/values.yaml",
		"chart/reprieve/templates/*", "chart/values-*.yaml", "chart/examples/*.yaml", "prometheus/*.yaml"} {
		m, err := filepath.Glob(g)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m...)
	}
	if len(out) < 20 {
		t.Fatalf("found %d documentation files: the globs are wrong", len(out))
	}
	return out
}

// shippedAlerts are the alerts of the shipped rule file.
func shippedAlerts(t *testing.T) map[string]bool {
	t.Helper()
	var rf ruleFile
	readYAML(t, rulesPath, &rf)
	out := map[string]bool{}
	for _, a := range alertNames(rf) {
		out[a] = true
	}
	return out
}

var alertRef = regexp.MustCompile(`\bReprieve[A-Z][A-Za-z]+\b\*?`)

// TestDocsNameRealAlerts (issue 49, item 3): every alert a document names (Reprieve...; a trailing
// * for the alerts of a prefix) is an alert of deploy/prometheus/rules.yaml. values.yaml named a
// ReprieveDaemonSetIncomplete that never existed.
func TestDocsNameRealAlerts(t *testing.T) {
	alerts := shippedAlerts(t)
	if len(alerts) < 10 {
		t.Fatalf("%d alerts in %s: the parse is wrong", len(alerts), rulesPath)
	}
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range alertRef.FindAllString(string(b), -1) {
			if prefix, ok := strings.CutSuffix(m, "*"); ok {
				found := false
				for a := range alerts {
					found = found || strings.HasPrefix(a, prefix)
				}
				if !found {
					t.Errorf("%s: %s matches no alert of %s", f, m, rulesPath)
				}
				continue
			}
			if !alerts[m] {
				t.Errorf("%s names the alert %s, which %s does not have", f, m, rulesPath)
			}
		}
	}
}

// schemaPaths are the value paths the chart's schema declares, each with its enum when it has one.
func schemaPaths(t *testing.T) map[string][]any {
	t.Helper()
	b, err := os.ReadFile(valuesSchema)
	if err != nil {
		t.Fatal(err)
	}
	var root schemaNode
	if err := json.Unmarshal(b, &root); err != nil {
		t.Fatal(err)
	}
	out := map[string][]any{}
	var walk func(prefix string, n *schemaNode)
	walk = func(prefix string, n *schemaNode) {
		for k, c := range n.Properties {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			out[p] = c.Enum
			walk(p, c)
		}
	}
	walk("", &root)
	return out
}

// valuesDefaults are values.yaml's defaults by path (maps flattened; lists and scalars as leaves).
func valuesDefaults(t *testing.T) map[string]any {
	t.Helper()
	b, err := os.ReadFile(valuesPath)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	out := map[string]any{}
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, x := range m {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			out[p] = x
			if sub, ok := x.(map[string]any); ok {
				walk(p, sub)
			}
		}
	}
	walk("", v)
	return out
}

var (
	// A backticked chart value, alone or set: `evictionGuard.offSpot`, `nodes: all`,
	// `evictionGuard.offSpot=preferred`.
	valueRef = regexp.MustCompile("`([a-z][A-Za-z0-9]*(?:\\.[a-zA-Z0-9]+)*)(?:(: |=)([^`]*))?`")
	// A stated default: `path` (default `X`), `path` (`X`, the default ...), `path` (... default `X`).
	valueDefault = regexp.MustCompile("`([a-z][A-Za-z0-9]*(?:\\.[a-zA-Z0-9]+)+|[a-z][A-Za-z0-9]+)` \\((?:`([^`]+)`, the default|default `([^`]+)`)")
)

// TestDocsNameRealValues (issue 49, item 3): every chart value a document names in backticks,
// whose first part is one of the chart's top-level values, is a value of the schema; one set to
// a word of an enum (`offSpot=preferred`, `nodes: all`) is set to one of its words; and a
// document that states a value's default ("`nodes` (`spot`, the default", "(default `x`)")
// states values.yaml's.
func TestDocsNameRealValues(t *testing.T) {
	paths := schemaPaths(t)
	defaults := valuesDefaults(t)
	flagOf, flagDefaults := chartFlags(t)
	checked := 0
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, m := range valueRef.FindAllStringSubmatch(text, -1) {
			path, sep, val := m[1], m[2], m[3]
			first, _, dotted := strings.Cut(path, ".")
			if _, known := paths[first]; !known || (!dotted && sep != ": ") {
				// Not a chart value; a top-level one alone (a word such as `cloud`); or
				// key=value of a taint or label (`cloud=spot:NoExecute`).
				continue
			}
			if _, ok := paths[path]; !ok {
				// A value's own keys (evictionGuard.tls.certManager.issuerRef.name): the
				// schema's object ends the path.
				if !prefixIsFreeObject(paths, path) {
					t.Errorf("%s names the chart value `%s`, which the schema (%s) does not have", f, m[0], valuesSchema)
				}
				continue
			}
			checked++
			if enum := paths[path]; sep != "" && len(enum) > 0 && !slices.ContainsFunc(enum, func(e any) bool { return fmt.Sprint(e) == strings.Trim(val, `"`) }) {
				t.Errorf("%s sets %s to %q; the schema allows %v", f, path, val, enum)
			}
		}
		for _, m := range valueDefault.FindAllStringSubmatch(text, -1) {
			path, stated := m[1], m[2]+m[3]
			def, ok := defaults[path]
			if !ok {
				continue // a flag or another program's setting
			}
			got := fmt.Sprint(def)
			if def == "" || def == nil {
				// The chart passes no flag: the agent's default holds.
				if flag, ok := flagOf[path]; ok {
					got = flagDefaults[flag]
				}
			}
			if got != stated {
				t.Errorf("%s says the default of %s is %q; the chart's is %q", f, path, stated, got)
			}
		}
	}
	if checked < 50 {
		t.Errorf("only %d chart values named in the documents: the parse is wrong", checked)
	}
}

// chartFlags reads, from the DaemonSet's template, the agent flag each value sets when it is
// not empty ({{- with .Values.X }} ... REPRIEVE_FLAG), and from docs/flags.md (generated from
// --help, TestFlagsDoc) each flag's default: what an empty value leaves in force.
func chartFlags(t *testing.T) (flagOf map[string]string, defaults map[string]string) {
	t.Helper()
	tmpl, err := os.ReadFile("chart/reprieve/templates/daemonset.yaml")
	if err != nil {
		t.Fatal(err)
	}
	flagOf = map[string]string{}
	for _, m := range regexp.MustCompile(`with (\$p|\.Values)\.([A-Za-z.]+) \}\}\s*\n\s*- \{name: REPRIEVE_([A-Z_]+)`).FindAllStringSubmatch(string(tmpl), -1) {
		path := m[2]
		if m[1] == "$p" {
			path = "pressure." + path
		}
		flagOf[path] = strings.ToLower(strings.ReplaceAll(m[3], "_", "-"))
	}
	if flagOf["interruptionEviction"] != "interruption-eviction" {
		t.Fatalf("values to flags %v: the parse of the DaemonSet's template is wrong", flagOf)
	}
	doc, err := os.ReadFile("../docs/flags.md")
	if err != nil {
		t.Fatal(err)
	}
	defaults = map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^\s+--([a-z0-9-]+) \S+ .*\(default "?([^")]*)"?\)$`).FindAllStringSubmatch(string(doc), -1) {
		defaults[m[1]] = m[2]
	}
	return flagOf, defaults
}

// prefixIsFreeObject says whether a leading part of path is a schema value of type object
// without properties of its own (nodeSelector, podLabels, affinity, resources, ...), whose keys
// are the user's.
func prefixIsFreeObject(paths map[string][]any, path string) bool {
	parts := strings.Split(path, ".")
	for i := len(parts) - 1; i > 0; i-- {
		p := strings.Join(parts[:i], ".")
		if _, ok := paths[p]; ok {
			// A declared value with no declared child of this name: a free object's key.
			child := p + "." + parts[i]
			_, declared := paths[child]
			return !declared
		}
	}
	return false
}

// TestOperationsListsEveryEvent: every Event reason the agent records (agent/events, and the
// start's KarpenterManaged) is in docs/operations.md's events table. VolumeAtRisk and
// EventApproved were missing from it.
func TestOperationsListsEveryEvent(t *testing.T) {
	src, err := os.ReadFile("../agent/events/events.go")
	if err != nil {
		t.Fatal(err)
	}
	reasons := regexp.MustCompile(`\bReason[A-Za-z]+\s*=\s*"([A-Za-z]+)"`).FindAllStringSubmatch(string(src), -1)
	if len(reasons) < 15 {
		t.Fatalf("%d reasons in agent/events/events.go: the parse is wrong", len(reasons))
	}
	ops, err := os.ReadFile(operationsPath)
	if err != nil {
		t.Fatal(err)
	}
	var table strings.Builder
	for _, line := range strings.Split(string(ops), "\n") {
		if strings.HasPrefix(line, "| Node |") || strings.HasPrefix(line, "| Pod |") {
			table.WriteString(line + "\n")
		}
	}
	for _, r := range append(reasons, []string{"", "KarpenterManaged"}) {
		if !strings.Contains(table.String(), "`"+r[1]+"`") {
			t.Errorf("docs/operations.md's events table lacks the reason %s", r[1])
		}
	}
}

// placeholder is a figure's name left in a document for a measurement to replace (the README
// showed `DEMO_COLD_FIGURE` in its table of cold timings after the issue 49 merge).
var placeholder = regexp.MustCompile(`\b[A-Z][A-Z0-9_]*_(FIGURE|TODO|TBD|PLACEHOLDER)S?\b|\bTODO\(figure\)|\bTBD\b`)

// TestDocsHaveNoPlaceholders: every figure a document promises is written in.
func TestDocsHaveNoPlaceholders(t *testing.T) {
	for _, f := range docFiles(t) {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			// REPRIEVE_REALNODE_FIGURES and its kind are the test bed's environment variables.
			if m := placeholder.FindString(line); m != "" && !strings.HasPrefix(m, "REPRIEVE_") {
				t.Errorf("%s:%d: placeholder %q where a figure or a word belongs", f, i+1, m)
			}
		}
	}
}
