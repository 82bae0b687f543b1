package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

const (
	valuesPath    = "chart/reprieve/values.yaml"
	valuesSchema  = "chart/reprieve/values.schema.json"
	valuesDocPath = "../docs/values.md"
)

// schemaNode is the part of a JSON schema the values table reads.
type schemaNode struct {
	Type        any                    `json:"type"`
	Enum        []any                  `json:"enum"`
	Description string                 `json:"description"`
	Properties  map[string]*schemaNode `json:"properties"`
	Ref         string                 `json:"$ref"`
}

// valuesDoc renders docs/values.md: one row per value of the chart, from values.schema.json
// (which Helm enforces at install, rejects unknown keys with, and describes every key in) and
// the defaults in values.yaml. Generated rather than kept by hand, so that it cannot drift from
// the chart as the install guide's hand-kept table did (requests 64Mi/128Mi against 48Mi/112Mi).
func valuesDoc(schema []byte, values []byte) (string, error) {
	var root schemaNode
	if err := json.Unmarshal(schema, &root); err != nil {
		return "", fmt.Errorf("parsing %s: %w", valuesSchema, err)
	}
	var defaults map[string]any
	if err := yaml.Unmarshal(values, &defaults); err != nil {
		return "", fmt.Errorf("parsing %s: %w", valuesPath, err)
	}
	var b strings.Builder
	b.WriteString("# Chart values\n\n<!-- Generated from deploy/chart/reprieve/values.schema.json and values.yaml by\n" +
		"`go test ./deploy -run TestValuesDoc -update`; do not edit by hand. -->\n\n" +
		"Every value of the Helm chart `deploy/chart/reprieve`. The schema rejects any other key, so a\n" +
		"misspelled value fails `helm install` instead of being ignored. `values.yaml` explains each\n" +
		"value at more length.\n\n| value | type | default | description |\n|---|---|---|---|\n")
	var walk func(prefix string, n *schemaNode, def any)
	walk = func(prefix string, n *schemaNode, def any) {
		keys := make([]string, 0, len(n.Properties))
		for k := range n.Properties {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		defs, _ := def.(map[string]any)
		for _, k := range keys {
			c := n.Properties[k]
			name := k
			if prefix != "" {
				name = prefix + "." + k
			}
			if len(c.Properties) > 0 && c.Ref == "" {
				walk(name, c, defs[k])
				continue
			}
			d, ok := defs[k]
			shown := "unset"
			if ok {
				j, err := json.Marshal(d)
				if err == nil {
					shown = "`" + string(j) + "`"
				}
			}
			typ := fmt.Sprint(c.Type)
			if ts, ok := c.Type.([]any); ok {
				parts := make([]string, len(ts))
				for i, t := range ts {
					parts[i] = fmt.Sprint(t)
				}
				typ = strings.Join(parts, " or ")
			}
			if c.Type == nil && c.Ref != "" {
				typ = "object"
			}
			if len(c.Enum) > 0 {
				parts := make([]string, 0, len(c.Enum))
				for _, e := range c.Enum {
					if s := fmt.Sprint(e); s != "" {
						parts = append(parts, s)
					}
				}
				typ += ": " + strings.Join(parts, ", ")
			}
			desc := strings.ReplaceAll(c.Description, "|", `\|`)
			fmt.Fprintf(&b, "| `%s` | %s | %s | %s |\n", name, typ, strings.ReplaceAll(shown, "|", `\|`), desc)
		}
	}
	walk("", &root, defaults)
	return b.String(), nil
}

// TestValuesDoc: docs/values.md is the table valuesDoc renders now, and every value in
// values.yaml is in the schema with a description (so the table has no blank rows).
func TestValuesDoc(t *testing.T) {
	schema, err := os.ReadFile(valuesSchema)
	if err != nil {
		t.Fatal(err)
	}
	values, err := os.ReadFile(valuesPath)
	if err != nil {
		t.Fatal(err)
	}
	var root schemaNode
	if err := json.Unmarshal(schema, &root); err != nil {
		t.Fatal(err)
	}
	var defaults map[string]any
	if err := yaml.Unmarshal(values, &defaults); err != nil {
		t.Fatal(err)
	}
	var check func(prefix string, n *schemaNode, def map[string]any)
	check = func(prefix string, n *schemaNode, def map[string]any) {
		for k, v := range def {
			c, ok := n.Properties[k]
			if !ok {
				t.Errorf("%s%s is in values.yaml but not in the schema", prefix, k)
				continue
			}
			if c.Description == "" {
				t.Errorf("%s%s has no description in the schema", prefix, k)
			}
			if sub, ok := v.(map[string]any); ok && len(c.Properties) > 0 && c.Ref == "" {
				check(prefix+k+".", c, sub)
			}
		}
	}
	check("", &root, defaults)

	got, err := valuesDoc(schema, values)
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile(valuesDocPath, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(valuesDocPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(want, []byte(got)) {
		t.Errorf("docs/values.md is stale: run go test ./deploy -run TestValuesDoc -update")
	}
}
