package deploy

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/reprieve-dev/reprieve/agent/metrics"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"sigs.k8s.io/yaml"

	"github.com/reprieve-dev/reprieve/agent/guard"
	"github.com/reprieve-dev/reprieve/providers"
)

var update = flag.Bool("update", false, "rewrite "+promRulePath+" from "+rulesPath)

// Paths are relative to this package's directory, where go test runs.
const (
	rulesPath      = "prometheus/rules.yaml"
	promRulePath   = "prometheus/prometheusrule.yaml"
	podMonitorPath = "prometheus/podmonitor.yaml"
	ruleTestsGlob  = "prometheus/tests/*.yaml"
	dashboardPath  = "grafana/dashboard.json"
	daemonSetPath  = "manifests/daemonset.yaml"
	operationsPath = "../docs/operations.md"

	runbookBase = "https://github.com/reprieve-dev/reprieve/blob/main/docs/operations.md#"
)

// allowedForeignMetrics are names the rules and dashboard may use that reprieve does not export.
var allowedForeignMetrics = map[string]string{
	"up": "Prometheus's own per-target series",
	// kube-state-metrics v2 names, for ReprieveAgentAbsent's DaemonSet check.
	"kube_daemonset_status_desired_number_scheduled": "kube-state-metrics",
	"kube_daemonset_status_number_ready":             "kube-state-metrics",
	// ReprieveEvictionGuardDown's check of guard replicas that never started.
	"kube_deployment_status_replicas_available": "kube-state-metrics",
}

type ruleFile struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name  string `json:"name"`
	Rules []rule `json:"rules"`
}

type rule struct {
	Alert       string            `json:"alert"`
	Record      string            `json:"record"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// readYAML reads path into out through sigs.k8s.io/yaml, which goes by the json tags and
// rejects nothing silently: a file that does not parse fails the test.
func readYAML(t *testing.T, path string, out any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, out); err != nil {
		t.Fatalf("parsing %s: %v", path, err)
	}
}

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	var f ruleFile
	readYAML(t, rulesPath, &f)
	if len(f.Groups) == 0 {
		t.Fatalf("%s has no groups", rulesPath)
	}
	return f
}

// alertNames returns the distinct alert names of f, in file order.
func alertNames(f ruleFile) []string {
	var names []string
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" && !slices.Contains(names, r.Alert) {
				names = append(names, r.Alert)
			}
		}
	}
	return names
}

// The alerts the brief for deploy/ asks for; a rule file that loses one fails here.
var wantAlerts = []string{
	"ReprieveInterruptionImminent",
	"ReprieveEvictionMissedDeadline",
	"ReprievePodsOutlivedReclaim",
	"ReprieveVolumeStillInUse",
	"ReprieveVolumeAtRisk",
	"ReprievePodsBlockedByPDB",
	"ReprievePressureTaintTooLong",
	"ReprievePressureSignalsUnreadable",
	"ReprieveMetadataFailing",
	"ReprieveAgentBlind",
	"ReprieveAgentDown",
	"ReprieveAgentAbsent",
	"ReprieveNodeWritesRefused",
	"ReprieveAgentNotReady",
	"ReprieveEvictionGuardDown",
	"ReprieveEvictionGuardFailing",
	"ReprieveEvictionGuardUnreachable",
	"ReprieveEvictionGuardCertificateExpiring",
}

func TestRules(t *testing.T) {
	f := loadRules(t)
	if got := alertNames(f); !reflect.DeepEqual(got, wantAlerts) {
		t.Errorf("alerts in %s = %v, want %v", rulesPath, got, wantAlerts)
	}
	if len(f.Groups) != 1 || f.Groups[0].Name != "reprieve" {
		t.Errorf("%s: want one group named reprieve", rulesPath)
	}
	severities := []string{"info", "warning", "critical"}
	for _, g := range f.Groups {
		for i, r := range g.Rules {
			name := fmt.Sprintf("%s[%d] %s", g.Name, i, r.Alert)
			if r.Alert == "" {
				t.Errorf("%s: only alerting rules belong in this file", name)
				continue
			}
			if strings.TrimSpace(r.Expr) == "" {
				t.Errorf("%s: empty expr", name)
			}
			if r.For != "" {
				if d, err := time.ParseDuration(r.For); err != nil || d < 0 {
					t.Errorf("%s: for %q is not a duration", name, r.For)
				}
			}
			// Alert labels are a routing key: a fixed, bounded set.
			for k := range r.Labels {
				if k != "severity" {
					t.Errorf("%s: label %q; alerts add only severity (the series bring the rest)", name, k)
				}
			}
			if !slices.Contains(severities, r.Labels["severity"]) {
				t.Errorf("%s: severity %q, want one of %v", name, r.Labels["severity"], severities)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: missing annotation %s", name, a)
				}
			}
			if want := runbookBase + strings.ToLower(r.Alert); r.Annotations["runbook_url"] != want {
				t.Errorf("%s: runbook_url %q, want %q", name, r.Annotations["runbook_url"], want)
			}
		}
	}
}

// TestRunbookAnchors checks that every runbook_url points at a heading of docs/operations.md.
func TestRunbookAnchors(t *testing.T) {
	// The runbooks ship with the rules: a missing operations.md is a failure, not a skip.
	doc, err := os.ReadFile(operationsPath)
	if err != nil {
		t.Fatalf("the alerts' runbooks: %v", err)
	}
	anchors := map[string]bool{}
	for _, line := range strings.Split(string(doc), "\n") {
		if strings.HasPrefix(line, "#") {
			anchors[githubAnchor(strings.TrimLeft(line, "# "))] = true
		}
	}
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			anchor := strings.TrimPrefix(r.Annotations["runbook_url"], runbookBase)
			if !anchors[anchor] {
				t.Errorf("%s: %s has no heading with anchor #%s", r.Alert, operationsPath, anchor)
			}
		}
	}
}

// githubAnchor is the fragment GitHub gives a Markdown heading: lower case, spaces to dashes,
// punctuation other than - and _ dropped.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

// promRuleHeader starts prometheusrule.yaml; -update appends rules.yaml's groups under spec.
const promRuleHeader = `# Generated from rules.yaml by ` + "`go test ./deploy -run TestPrometheusRule -update`" + `: edit rules.yaml.
# The same alerts as a PrometheusRule for the Prometheus Operator. Your Prometheus may select
# rules by label (kube-prometheus-stack: ` + "`release: <name>`" + `): add that label here if so.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: reprieve
  namespace: kube-system
  labels: {app.kubernetes.io/name: reprieve}
spec:
`

// renderPrometheusRule indents rules.yaml, from its groups: line on, under spec:.
func renderPrometheusRule(rules []byte) ([]byte, error) {
	lines := strings.Split(string(rules), "\n")
	start := slices.Index(lines, "groups:")
	if start < 0 {
		return nil, fmt.Errorf("%s has no top-level groups: line", rulesPath)
	}
	var b bytes.Buffer
	b.WriteString(promRuleHeader)
	for _, l := range lines[start:] {
		if l != "" {
			b.WriteString("  " + l)
		}
		b.WriteString("\n")
	}
	return bytes.TrimRight(b.Bytes(), "\n"), nil
}

func TestPrometheusRule(t *testing.T) {
	if *update {
		src, err := os.ReadFile(rulesPath)
		if err != nil {
			t.Fatal(err)
		}
		out, err := renderPrometheusRule(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(promRulePath, append(out, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// Compared as generic values, so that any field, known to ruleFile or not, must agree.
	var plain map[string]any
	readYAML(t, rulesPath, &plain)
	var cr struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Metadata   struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
		Spec map[string]any `json:"spec"`
	}
	readYAML(t, promRulePath, &cr)
	if cr.APIVersion != "monitoring.coreos.com/v1" || cr.Kind != "PrometheusRule" {
		t.Errorf("%s is %s %s, want monitoring.coreos.com/v1 PrometheusRule", promRulePath, cr.APIVersion, cr.Kind)
	}
	if cr.Metadata.Name != "reprieve" || cr.Metadata.Namespace != "kube-system" {
		t.Errorf("%s is %s/%s, want kube-system/reprieve", promRulePath, cr.Metadata.Namespace, cr.Metadata.Name)
	}
	for k := range cr.Spec {
		if k != "groups" {
			t.Errorf("%s: spec.%s is not in %s", promRulePath, k, rulesPath)
		}
	}
	want, got := plain["groups"], cr.Spec["groups"]
	if want == nil {
		t.Fatalf("%s has no groups", rulesPath)
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s's groups differ from %s's%s; regenerate with `go test ./deploy -run TestPrometheusRule -update`",
			promRulePath, rulesPath, firstDifference(got, want))
	}
}

// firstDifference names the first rule that differs between two generic groups lists.
func firstDifference(got, want any) string {
	g, _ := got.([]any)
	w, _ := want.([]any)
	if len(g) != len(w) {
		return fmt.Sprintf(" (%d groups, want %d)", len(g), len(w))
	}
	for i := range w {
		gr, _ := g[i].(map[string]any)["rules"].([]any)
		wr, _ := w[i].(map[string]any)["rules"].([]any)
		for j := range max(len(gr), len(wr)) {
			if j >= len(gr) || j >= len(wr) || !reflect.DeepEqual(gr[j], wr[j]) {
				gj, _ := json.Marshal(at(gr, j))
				wj, _ := json.Marshal(at(wr, j))
				return fmt.Sprintf(" at group %d rule %d:\n got %s\nwant %s", i, j, gj, wj)
			}
		}
	}
	return ""
}

func at(s []any, i int) any {
	if i < len(s) {
		return s[i]
	}
	return nil
}

type ruleTestFile struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		AlertRuleTests []struct {
			EvalTime  string           `json:"eval_time"`
			Alertname string           `json:"alertname"`
			ExpAlerts []map[string]any `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

// TestRuleTestsCoverEveryAlert checks, without promtool, that the promtool unit tests load the
// real rule file and hold for every alert a case where it fires and one where it does not.
func TestRuleTestsCoverEveryAlert(t *testing.T) {
	files, err := filepath.Glob(ruleTestsGlob)
	if err != nil || len(files) == 0 {
		t.Fatalf("no rule tests at %s (%v)", ruleTestsGlob, err)
	}
	firing, quiet := map[string]bool{}, map[string]bool{}
	for _, path := range files {
		var f ruleTestFile
		readYAML(t, path, &f)
		if len(f.RuleFiles) != 1 || filepath.Clean(filepath.Join(filepath.Dir(path), f.RuleFiles[0])) != filepath.Clean(rulesPath) {
			t.Errorf("%s: rule_files %v, want exactly the relative path of %s", path, f.RuleFiles, rulesPath)
		}
		for _, tc := range f.Tests {
			for _, a := range tc.AlertRuleTests {
				if len(a.ExpAlerts) > 0 {
					firing[a.Alertname] = true
				} else {
					quiet[a.Alertname] = true
				}
			}
		}
	}
	names := alertNames(loadRules(t))
	for _, name := range names {
		if !firing[name] {
			t.Errorf("no promtool test case where %s fires", name)
		}
		if !quiet[name] {
			t.Errorf("no promtool test case where %s stays quiet", name)
		}
	}
	for name := range firing {
		if !slices.Contains(names, name) {
			t.Errorf("promtool tests expect alert %s, which %s does not have", name, rulesPath)
		}
	}
}

// knownMetrics returns the series names reprieve's registry exposes (histograms as their
// _bucket, _sum and _count series), built as cmd/reprieve builds it for AWS.
func knownMetrics(t *testing.T) map[string]bool {
	t.Helper()
	reg := prometheus.NewRegistry()
	rec := &recordingRegisterer{Registerer: reg}
	m, err := metrics.New(rec, "aws")
	if err != nil {
		t.Fatalf("metrics.New: %v", err)
	}
	rm, err := providers.NewRequestMetrics(rec, "aws")
	if err != nil {
		t.Fatalf("providers.NewRequestMetrics: %v", err)
	}
	// The agent's readiness and sight, computed at each scrape.
	if err := rec.Register(metrics.NewSight(metrics.Sight{Provider: "aws", Ready: func() bool { return true },
		LastAnswers: func() map[string]time.Time { return map[string]time.Time{"aws": {}} }, Stale: func() int { return 0 }})); err != nil {
		t.Fatal(err)
	}
	// The eviction guard's, which its own process serves (reprieve eviction-guard).
	if _, err := guard.NewMetrics(rec); err != nil {
		t.Fatalf("guard.NewMetrics: %v", err)
	}
	if _, err := guard.NewCertMetrics(rec); err != nil {
		t.Fatalf("guard.NewCertMetrics: %v", err)
	}
	if _, err := guard.NewIndexMetrics(rec); err != nil {
		t.Fatalf("guard.NewIndexMetrics: %v", err)
	}
	if _, err := guard.NewReckonMetrics(rec); err != nil {
		t.Fatalf("guard.NewReckonMetrics: %v", err)
	}
	for _, c := range []prometheus.Collector{collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})} {
		if err := rec.Register(c); err != nil {
			t.Fatal(err)
		}
	}
	// A Vec with no children is not gathered, so its type would be unknown: give those that
	// start empty a child.
	m.TaintActive.WithLabelValues("cloud").Set(1)
	m.BuildInfo.WithLabelValues("test", "0000000", runtime.Version(), runtime.GOOS, runtime.GOARCH).Set(1)
	req, err := http.NewRequest(http.MethodGet, "http://169.254.169.254/latest/meta-data/spot/instance-action", nil)
	if err != nil {
		t.Fatal(err)
	}
	notFound := roundTripper(func(*http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: http.StatusNotFound, Body: io.NopCloser(strings.NewReader(""))}, nil
	})
	resp, err := rm.Wrap(notFound).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, mf := range mfs {
		name := mf.GetName()
		switch mf.GetType().String() {
		case "HISTOGRAM", "GAUGE_HISTOGRAM":
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				known[name+s] = true
			}
		case "SUMMARY":
			known[name], known[name+"_sum"], known[name+"_count"] = true, true, true
		default:
			known[name] = true
		}
	}
	// A family registered later without a child is not gathered: its name is known, its type
	// is not, so any of a histogram's series names is let through for it.
	for _, name := range rec.names(t) {
		if !known[name] && !known[name+"_count"] {
			t.Logf("%s is registered but not gathered (a Vec with no children): its type is not checked", name)
			for _, s := range []string{"", "_bucket", "_sum", "_count"} {
				known[name+s] = true
			}
		}
	}
	for _, must := range []string{"reprieve_notices_reclaim_deadline_timestamp_seconds", "reprieve_metadata_requests_total", "process_resident_memory_bytes"} {
		if !known[must] {
			t.Fatalf("registry lacks %s: the way this test builds it is out of date", must)
		}
	}
	return known
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// recordingRegisterer remembers every collector registered through it.
type recordingRegisterer struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	if err := r.Registerer.Register(c); err != nil {
		return err
	}
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

var fqNameRE = regexp.MustCompile(`fqName: "([^"]+)"`)

// names returns the fully-qualified names of the recorded collectors' descriptors. Desc has no
// accessor for its name; its String form has carried it as fqName: "..." since client_golang
// 0.9, and a change of that form fails here rather than passing silently.
func (r *recordingRegisterer) names(t *testing.T) []string {
	t.Helper()
	var names []string
	for _, c := range r.collectors {
		ch := make(chan *prometheus.Desc)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			m := fqNameRE.FindStringSubmatch(d.String())
			if m == nil {
				t.Fatalf("cannot read the metric name from %s", d)
			}
			names = append(names, m[1])
		}
	}
	return names
}

var (
	stringLitRE = regexp.MustCompile("\"(?:[^\"\\\\]|\\\\.)*\"|'(?:[^'\\\\]|\\\\.)*'|`[^`]*`")
	matchersRE  = regexp.MustCompile(`\{[^{}]*\}`)
	rangeRE     = regexp.MustCompile(`\[[^\[\]]*\]`)
	labelListRE = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	tokenRE     = regexp.MustCompile(`\$\{?\w+\}?|[0-9.][0-9A-Za-z_.]*|[A-Za-z_:][A-Za-z0-9_:]*`)
	identRE     = regexp.MustCompile(`^[A-Za-z_:][A-Za-z0-9_:]*$`)
	// The grafana variable query label_values(<selector>, <label>).
	labelValuesRE = regexp.MustCompile(`^\s*label_values\((.*),\s*[A-Za-z_]\w*\s*\)\s*$`)
)

// promqlKeywords are the identifiers of PromQL that are not metric names and are not followed by (.
var promqlKeywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"inf": true, "nan": true,
}

// metricNames returns the metric names an expression selects. It is not a PromQL parser: it
// drops string literals (label values, label_replace arguments), matcher bodies, ranges and the
// label lists of by/without/on/ignoring/group_*, then keeps identifiers that are neither keywords
// nor followed by "(" (functions and aggregations). promtool parses the same expressions in
// TestPromtool.
func metricNames(expr string) ([]string, error) {
	if strings.Contains(expr, "__name__") {
		return nil, fmt.Errorf("selects by __name__; write the metric name so it can be checked: %s", expr)
	}
	if m := labelValuesRE.FindStringSubmatch(expr); m != nil {
		expr = m[1]
	}
	s := stringLitRE.ReplaceAllString(expr, `""`)
	s = matchersRE.ReplaceAllString(s, "{}")
	s = rangeRE.ReplaceAllString(s, "[]")
	s = labelListRE.ReplaceAllString(s, " ")
	var names []string
	for _, loc := range tokenRE.FindAllStringIndex(s, -1) {
		tok := s[loc[0]:loc[1]]
		if !identRE.MatchString(tok) || promqlKeywords[strings.ToLower(tok)] {
			continue
		}
		if rest := strings.TrimLeft(s[loc[1]:], " \t\r\n"); strings.HasPrefix(rest, "(") {
			continue
		}
		if !slices.Contains(names, tok) {
			names = append(names, tok)
		}
	}
	return names, nil
}

func TestMetricNames(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`up{job="reprieve"} == 0`, []string{"up"}},
		{`up`, []string{"up"}},
		{`sum by (kind) (increase(a_total{job="x", node=~"$node"}[$__rate_interval]))`, []string{"a_total"}},
		{`sum without(outcome)(rate(a_total{o="e"}[5m])) / sum without (outcome) (rate(b_total[5m])) > 0.5`, []string{"a_total", "b_total"}},
		{`histogram_quantile(0.99, sum by (le) (rate(h_bucket{l="a{b}"}[1m])))`, []string{"h_bucket"}},
		{"a unless on (instance) max_over_time(b[30m:1m]) > 1e3 offset 5m", []string{"a", "b"}},
		{`x * on (node) group_left(key, pod) y`, []string{"x", "y"}},
		{`label_replace(m, "dst", "$1", "src", "(.*)")`, []string{"m"}},
		{`absent(up{job="r"}) unless on () (max(k) == 0)`, []string{"up", "k"}},
		{`label_values(up{job="reprieve"}, node)`, []string{"up"}},
		{`sum(rate(ns:recorded:rate5m [5m])) and bool vector(1)`, []string{"ns:recorded:rate5m"}},
		{`time() - 0x1F - Inf`, nil},
	} {
		got, err := metricNames(tc.expr)
		if err != nil {
			t.Errorf("metricNames(%q): %v", tc.expr, err)
			continue
		}
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("metricNames(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
	if _, err := metricNames(`{__name__="x"}`); err == nil {
		t.Errorf("metricNames accepted a __name__ selector")
	}
}

// dashboardQueries returns every PromQL expression of the dashboard, keyed by where it is: panel
// targets (rows' nested panels too), annotations and variable queries.
func dashboardQueries(t *testing.T, dash map[string]any) map[string]string {
	t.Helper()
	out := map[string]string{}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, c := range v {
				if s, ok := c.(string); ok && k == "expr" {
					out[path+"."+k] = s
				}
				walk(path+"."+k, c)
			}
		case []any:
			for i, c := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), c)
			}
		}
	}
	walk("", dash)
	vars, _ := dash["templating"].(map[string]any)["list"].([]any)
	for i, v := range vars {
		v := v.(map[string]any)
		if v["type"] != "query" {
			continue
		}
		q := v["query"]
		if m, ok := q.(map[string]any); ok {
			q = m["query"]
		}
		s, ok := q.(string)
		if !ok || s == "" {
			t.Errorf("variable %v: no query string", v["name"])
			continue
		}
		out[fmt.Sprintf(".templating.list[%d].query", i)] = s
	}
	return out
}

func loadDashboard(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&dash); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardPath, err)
	}
	if dec.More() {
		t.Fatalf("%s: trailing data after the dashboard object", dashboardPath)
	}
	return dash
}

func TestMetricNamesExist(t *testing.T) {
	known := knownMetrics(t)
	exprs := map[string]string{}
	for _, g := range loadRules(t).Groups {
		for i, r := range g.Rules {
			exprs[fmt.Sprintf("%s: %s rule %d (%s)", rulesPath, g.Name, i, r.Alert)] = r.Expr
		}
	}
	for where, e := range dashboardQueries(t, loadDashboard(t)) {
		exprs[dashboardPath+": "+where] = e
	}
	if len(exprs) < 10 {
		t.Fatalf("found only %d expressions in the rules and dashboard", len(exprs))
	}
	used := map[string]bool{}
	for _, where := range sortedKeys(exprs) {
		names, err := metricNames(exprs[where])
		if err != nil {
			t.Errorf("%s: %v", where, err)
			continue
		}
		if len(names) == 0 {
			t.Errorf("%s: no metric name found in %q", where, exprs[where])
		}
		for _, n := range names {
			used[n] = true
			switch {
			case known[n]:
			case allowedForeignMetrics[n] != "":
			case strings.HasPrefix(n, "reprieve_"):
				t.Errorf("%s: %s is not a metric reprieve registers (a typo, or a bare histogram name without _bucket/_sum/_count?)", where, n)
			default:
				t.Errorf("%s: %s is neither reprieve's nor in allowedForeignMetrics", where, n)
			}
		}
	}
	for n := range allowedForeignMetrics {
		if !used[n] {
			t.Errorf("allowedForeignMetrics lists %s, which nothing uses: remove it", n)
		}
	}
}

func TestDashboard(t *testing.T) {
	dash := loadDashboard(t)
	for _, k := range []string{"title", "uid"} {
		if s, _ := dash[k].(string); s == "" {
			t.Errorf("dashboard has no %s", k)
		}
	}
	vars, _ := dash["templating"].(map[string]any)["list"].([]any)
	hasDS := false
	for _, v := range vars {
		v, _ := v.(map[string]any)
		if v["type"] == "datasource" && v["name"] == "datasource" && v["query"] == "prometheus" {
			hasDS = true
		}
	}
	if !hasDS {
		t.Errorf("dashboard has no Prometheus datasource variable named datasource")
	}
	// A second release (job reprieve-gpu) and a second cluster are a variable away: every query
	// selects on both, none on a fixed job.
	names := map[string]bool{}
	for _, v := range vars {
		v, _ := v.(map[string]any)
		name, _ := v["name"].(string)
		names[name] = true
	}
	if !names["cluster"] || !names["job"] {
		t.Errorf("dashboard variables %v: want cluster and job", names)
	}
	for title, e := range dashboardQueries(t, dash) {
		if strings.HasPrefix(title, ".templating.") {
			continue // the variables' own queries, which list the clusters and jobs
		}
		if !strings.Contains(e, `cluster=~"$cluster", job=~"$job"`) || strings.Contains(e, `job="`) {
			t.Errorf("panel %q: %s does not select cluster=~\"$cluster\", job=~\"$job\"", title, e)
		}
	}
	// Every Prometheus datasource reference goes through the variable: no instance's uid.
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			if ds, ok := v["datasource"]; ok {
				m, _ := ds.(map[string]any)
				grafana := m != nil && m["type"] == "grafana"
				if !grafana && (m == nil || m["type"] != "prometheus" || m["uid"] != "${datasource}") {
					t.Errorf("%s.datasource = %v, want {type: prometheus, uid: ${datasource}}", path, ds)
				}
			}
			for k, c := range v {
				walk(path+"."+k, c)
			}
		case []any:
			for i, c := range v {
				walk(fmt.Sprintf("%s[%d]", path, i), c)
			}
		}
	}
	walk("", dash)

	panels, _ := dash["panels"].([]any)
	type rect struct{ x, y, w, h int }
	ids := map[float64]bool{}
	var placed []rect
	var titles []string
	for i, p := range panels {
		p, _ := p.(map[string]any)
		title, _ := p["title"].(string)
		titles = append(titles, title)
		id, _ := p["id"].(float64)
		if id == 0 || ids[id] {
			t.Errorf("panel %d %q: id %v missing or repeated", i, title, p["id"])
		}
		ids[id] = true
		g, _ := p["gridPos"].(map[string]any)
		num := func(k string) int { f, _ := g[k].(float64); return int(f) }
		r := rect{num("x"), num("y"), num("w"), num("h")}
		if r.w <= 0 || r.h <= 0 || r.x < 0 || r.x+r.w > 24 {
			t.Errorf("panel %q: gridPos %v is off the 24-column grid", title, g)
		}
		for _, o := range placed {
			if r.x < o.x+o.w && o.x < r.x+r.w && r.y < o.y+o.h && o.y < r.y+r.h {
				t.Errorf("panel %q overlaps another at %v", title, g)
			}
		}
		placed = append(placed, r)
		if p["type"] == "row" {
			continue
		}
		targets, _ := p["targets"].([]any)
		if len(targets) == 0 {
			t.Errorf("panel %q has no queries", title)
		}
		for _, tg := range targets {
			if e, _ := tg.(map[string]any)["expr"].(string); strings.TrimSpace(e) == "" {
				t.Errorf("panel %q: a target without expr", title)
			}
		}
	}
	// The rows the dashboard is organised by, the pressure one among them.
	for _, want := range []string{"Interruptions", "Deadline compliance", "Metadata service", "Taints", "Node pressure"} {
		if !slices.Contains(titles, want) {
			t.Errorf("dashboard has no row %q", want)
		}
	}
}

func TestPodMonitor(t *testing.T) {
	var pm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
		Spec       struct {
			JobLabel          string `json:"jobLabel"`
			NamespaceSelector struct {
				MatchNames []string `json:"matchNames"`
			} `json:"namespaceSelector"`
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			Endpoints []struct {
				Port          string `json:"port"`
				Path          string `json:"path"`
				Interval      string `json:"interval"`
				ScrapeTimeout string `json:"scrapeTimeout"`
				Relabelings   []struct {
					SourceLabels []string `json:"sourceLabels"`
					TargetLabel  string   `json:"targetLabel"`
					Action       string   `json:"action"`
					Replacement  *string  `json:"replacement"`
				} `json:"relabelings"`
			} `json:"podMetricsEndpoints"`
		} `json:"spec"`
	}
	readYAML(t, podMonitorPath, &pm)
	var ds struct {
		Metadata struct {
			Namespace string `json:"namespace"`
		} `json:"metadata"`
		Spec struct {
			Template struct {
				Metadata struct {
					Labels map[string]string `json:"labels"`
				} `json:"metadata"`
				Spec struct {
					Containers []struct {
						Ports []struct {
							Name string `json:"name"`
						} `json:"ports"`
					} `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	readYAML(t, daemonSetPath, &ds)

	if pm.APIVersion != "monitoring.coreos.com/v1" || pm.Kind != "PodMonitor" {
		t.Errorf("%s is %s %s, want monitoring.coreos.com/v1 PodMonitor", podMonitorPath, pm.APIVersion, pm.Kind)
	}
	podLabels := ds.Spec.Template.Metadata.Labels
	if len(pm.Spec.Selector.MatchLabels) == 0 {
		t.Errorf("PodMonitor selects every pod")
	}
	for k, v := range pm.Spec.Selector.MatchLabels {
		if podLabels[k] != v {
			t.Errorf("PodMonitor selects %s=%s, which the DaemonSet's pods do not carry", k, v)
		}
	}
	if ns := pm.Spec.NamespaceSelector.MatchNames; len(ns) > 0 && !slices.Contains(ns, ds.Metadata.Namespace) {
		t.Errorf("PodMonitor looks in %v, the DaemonSet is in %s", ns, ds.Metadata.Namespace)
	}
	// job is the jobLabel's value on the pod, unless a relabeling sets it.
	job := podLabels[pm.Spec.JobLabel]
	if len(pm.Spec.Endpoints) != 1 {
		t.Fatalf("PodMonitor has %d endpoints, want 1", len(pm.Spec.Endpoints))
	}
	ep := pm.Spec.Endpoints[0]
	var ports []string
	for _, c := range ds.Spec.Template.Spec.Containers {
		for _, p := range c.Ports {
			ports = append(ports, p.Name)
		}
	}
	if ep.Port != "metrics" || !slices.Contains(ports, ep.Port) {
		t.Errorf("PodMonitor scrapes port %q; want metrics, and the DaemonSet's ports are %v", ep.Port, ports)
	}
	if ep.Path != "/metrics" {
		t.Errorf("PodMonitor path %q, want /metrics", ep.Path)
	}
	interval, err1 := time.ParseDuration(ep.Interval)
	timeout, err2 := time.ParseDuration(ep.ScrapeTimeout)
	if err1 != nil || err2 != nil || timeout > interval {
		t.Errorf("PodMonitor interval %q, scrapeTimeout %q: want durations, the timeout no longer than the interval", ep.Interval, ep.ScrapeTimeout)
	}
	hasNode := false
	for _, r := range ep.Relabelings {
		if r.TargetLabel == "job" && r.Replacement != nil {
			job = *r.Replacement
		}
		if r.TargetLabel == "node" && reflect.DeepEqual(r.SourceLabels, []string{"__meta_kubernetes_pod_node_name"}) &&
			(r.Action == "" || strings.EqualFold(r.Action, "replace")) {
			hasNode = true
		}
	}
	if job != "reprieve" {
		t.Errorf("PodMonitor gives job=%q, the rules and dashboard expect job=\"reprieve\"", job)
	}
	if !hasNode {
		t.Errorf("PodMonitor has no relabeling from __meta_kubernetes_pod_node_name to node")
	}
}

// grafanaVars stand in for the dashboard's variables when promtool parses its queries.
var grafanaVars = strings.NewReplacer("$__rate_interval", "1m", "$__interval", "1m", "$__range", "1h", "$node", ".*", "$cluster", ".*", "$job", ".*")

// TestPromtool runs promtool over the rules, their unit tests, and the dashboard's queries
// (as recording rules, which promtool parses).
func TestPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("REPRIEVE_E2E_REQUIRED") == "1" {
			t.Fatal("promtool is not on PATH and REPRIEVE_E2E_REQUIRED=1: run `make promtool` (test/tools/prometheus.sh installs it)")
		}
		t.Skip("promtool is not on PATH; `make promtool` installs it")
	}
	run := func(args ...string) {
		t.Helper()
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	run("check", "rules", rulesPath)
	run("check", "rules", promRuleAsRuleFile(t))
	tests, err := filepath.Glob(ruleTestsGlob)
	if err != nil || len(tests) == 0 {
		t.Fatalf("no rule tests at %s", ruleTestsGlob)
	}
	run(append([]string{"test", "rules"}, tests...)...)

	// A second release, as the chart renders its rules (templates/prometheusrule.yaml): the same
	// substitution of job and daemonset in the rules and in the tests' series and expectations.
	// Every test passes for it too, so no alert is tied to the default release's name.
	gpu := strings.NewReplacer(`job="reprieve"`, `job="reprieve-gpu"`, `daemonset="reprieve"`, `daemonset="reprieve-gpu"`,
		"job: reprieve\n", "job: reprieve-gpu\n", "daemonset: reprieve\n", "daemonset: reprieve-gpu\n",
		"kube-system/reprieve ", "kube-system/reprieve-gpu ",
		`job="reprieve-eviction-guard"`, `job="reprieve-gpu-eviction-guard"`, `deployment="reprieve-eviction-guard"`, `deployment="reprieve-gpu-eviction-guard"`,
		"job: reprieve-eviction-guard\n", "job: reprieve-gpu-eviction-guard\n", "deployment: reprieve-eviction-guard\n", "deployment: reprieve-gpu-eviction-guard\n")
	dir := t.TempDir()
	rules, err := os.ReadFile(rulesPath)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(gpu.Replace(string(rules)), `job="reprieve"`) || !strings.Contains(gpu.Replace(string(rules)), `daemonset="reprieve-gpu"`) {
		t.Fatal("the second release's rules still select the default release")
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(gpu.Replace(string(rules))), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "tests"), 0o755); err != nil {
		t.Fatal(err)
	}
	var gpuTests []string
	for _, f := range tests {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(dir, "tests", filepath.Base(f))
		if err := os.WriteFile(out, []byte(gpu.Replace(string(b))), 0o644); err != nil {
			t.Fatal(err)
		}
		gpuTests = append(gpuTests, out)
	}
	run(append([]string{"test", "rules"}, gpuTests...)...)

	queries := dashboardQueries(t, loadDashboard(t))
	var records []map[string]string
	for i, where := range sortedKeys(queries) {
		e := queries[where]
		if labelValuesRE.MatchString(e) {
			e = labelValuesRE.FindStringSubmatch(e)[1]
		}
		e = grafanaVars.Replace(e)
		if strings.Contains(e, "$") {
			t.Errorf("%s: a Grafana variable this test does not know: %s", where, e)
		}
		records = append(records, map[string]string{"record": fmt.Sprintf("dashboard:query_%d", i), "expr": e})
	}
	data, err := json.Marshal(map[string]any{"groups": []any{map[string]any{"name": "dashboard", "rules": records}}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "dashboard-queries.yaml")
	if err := os.WriteFile(path, data, 0o644); err != nil { // JSON is YAML
		t.Fatal(err)
	}
	run("check", "rules", path)
}

// promRuleAsRuleFile writes the PrometheusRule's spec as a plain rule file, so that promtool
// checks what the Operator would load even if it drifted from rules.yaml.
func promRuleAsRuleFile(t *testing.T) string {
	t.Helper()
	var cr struct {
		Spec json.RawMessage `json:"spec"`
	}
	readYAML(t, promRulePath, &cr)
	path := filepath.Join(t.TempDir(), "prometheusrule-spec.yaml")
	if err := os.WriteFile(path, cr.Spec, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// chartRulesPath is the chart's copy of rulesPath: a chart cannot read files outside itself.
const (
	chartRulesPath     = "chart/reprieve/files/rules.yaml"
	chartDashboardPath = "chart/reprieve/files/dashboard.json"
)

// TestChartRulesCopy checks that the chart's PrometheusRule carries the alerts of rules.yaml.
func TestChartRulesCopy(t *testing.T) {
	for src, dst := range map[string]string{rulesPath: chartRulesPath, dashboardPath: chartDashboardPath} {
		want, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(dst)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from %s: run `make manifests`", dst, src)
		}
	}
}
