package deploy

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const warningPolicyPath = "chart/reprieve/templates/warning-policy.yaml"

// TestWarningPolicyTemplate checks what the chart's warning policy must keep whatever else
// changes in it: it only ever warns, it checks the kinds the issue lists on CREATE and UPDATE,
// and its default spot labels are the ones `reprieve audit` selects nodes by. The policy's
// behaviour is tested on the real API server (test/e2e/warning_policy_test.go).
func TestWarningPolicyTemplate(t *testing.T) {
	b, err := os.ReadFile(warningPolicyPath)
	if err != nil {
		t.Fatal(err)
	}
	tpl := string(b)

	actions := regexp.MustCompile(`(?m)^\s*validationActions:\s*(.*)$`).FindAllStringSubmatch(tpl, -1)
	if len(actions) != 1 || actions[0][1] != `["Warn", "Audit"]` {
		t.Errorf("validationActions %q, want exactly one [\"Warn\", \"Audit\"]", actions)
	}
	if !strings.Contains(tpl, "failurePolicy: Ignore") {
		t.Error("the warning policy must not fail requests when it cannot evaluate (failurePolicy: Ignore)")
	}
	var resources []string
	for _, m := range regexp.MustCompile(`(?m)^\s*resources:\s*\[(.*)\]$`).FindAllStringSubmatch(tpl, -1) {
		for _, r := range strings.Split(m[1], ",") {
			resources = append(resources, strings.Trim(strings.TrimSpace(r), `"`))
		}
	}
	slices.Sort(resources)
	if want := []string{"cronjobs", "deployments", "jobs", "pods", "replicasets", "statefulsets"}; !slices.Equal(resources, want) {
		t.Errorf("resources %v, want %v", resources, want)
	}
	ops := regexp.MustCompile(`(?m)^\s*operations:\s*(.*)$`).FindAllStringSubmatch(tpl, -1)
	for _, op := range ops {
		if op[1] != `["CREATE", "UPDATE"]` {
			t.Errorf("operations %s, want [\"CREATE\", \"UPDATE\"]", op[1])
		}
	}
	if len(ops) != 3 {
		t.Errorf("%d operations lines, want one per API group (3)", len(ops))
	}

	// The default labels: the chart's one list (reprieve.spotLabels, which TestSpotLabelsOneList
	// holds to reprieve audit's).
	if !strings.Contains(tpl, `range (include "reprieve.spotLabels" . | fromJsonArray)`) {
		t.Error("the warning policy's default spot labels do not come from the chart's reprieve.spotLabels")
	}
}

// TestWarningValuesMatchSchema checks that the admissionWarnings block of values.yaml and of
// values.schema.json name the same keys.
func TestWarningValuesMatchSchema(t *testing.T) {
	var values struct {
		AdmissionWarnings map[string]any `json:"admissionWarnings"`
	}
	readYAML(t, valuesPath, &values)
	var schema struct {
		Properties struct {
			AdmissionWarnings struct {
				AdditionalProperties *bool                     `json:"additionalProperties"`
				Properties           map[string]map[string]any `json:"properties"`
			} `json:"admissionWarnings"`
		} `json:"properties"`
	}
	b, err := os.ReadFile(valuesSchema)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	aw := schema.Properties.AdmissionWarnings
	if aw.AdditionalProperties == nil || *aw.AdditionalProperties {
		t.Error("admissionWarnings: the schema must refuse unknown keys (additionalProperties: false)")
	}
	var inValues, inSchema []string
	for k := range values.AdmissionWarnings {
		inValues = append(inValues, k)
	}
	for k, p := range aw.Properties {
		inSchema = append(inSchema, k)
		if d, _ := p["description"].(string); d == "" {
			t.Errorf("admissionWarnings.%s has no description in the schema", k)
		}
	}
	slices.Sort(inValues)
	slices.Sort(inSchema)
	if len(inValues) == 0 || !slices.Equal(inValues, inSchema) {
		t.Errorf("admissionWarnings keys: values.yaml %v, schema %v", inValues, inSchema)
	}
}
