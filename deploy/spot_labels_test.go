package deploy

import (
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"testing"

	"github.com/reprieve-dev/reprieve/agent/nodefacts"
)

// TestSpotLabelsOneList: the chart's one list of spot labels (reprieve.spotLabels, which the
// DaemonSet's selection, the eviction guard's anti-affinity and the warning policy read) is the
// list `reprieve audit` uses (nodefacts.SpotPoolSelectors), label for label and in order.
func TestSpotLabelsOneList(t *testing.T) {
	tpl, err := os.ReadFile("chart/reprieve/templates/_helpers.tpl")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)define "reprieve.spotLabels" -}}\s*(\[.*?\])\s*{{- end`).FindSubmatch(tpl)
	if m == nil {
		t.Fatal(`_helpers.tpl has no "reprieve.spotLabels" list`)
	}
	var labels []struct{ Key, Value string }
	if err := json.Unmarshal(m[1], &labels); err != nil {
		t.Fatalf("reprieve.spotLabels: %v", err)
	}
	var got []string
	for _, l := range labels {
		got = append(got, l.Key+"="+l.Value)
	}
	if !slices.Equal(got, nodefacts.SpotPoolSelectors) {
		t.Errorf("the chart's reprieve.spotLabels are %q; nodefacts.SpotPoolSelectors (reprieve audit) are %q: keep one list", got, nodefacts.SpotPoolSelectors)
	}
}
