package scenario

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestPrintTable: the send time is never before the notice (a pod whose grace is longer than
// the window is sent at once, not "-264 s"), and WHY says why each pod went when it did.
func TestPrintTable(t *testing.T) {
	t0 := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	end := t0.Add(35 * time.Second)
	gone := func(sent, after time.Duration, grace int64) Record {
		return Record{DeletedAt: t0.Add(sent), GoneAt: t0.Add(sent + after), LastGrace: grace}
	}
	rows := []Row{
		{Pod: "long-grace", Toleration: "none", Grace: 300, Planned: t0.Add(-265 * time.Second), ByDeadline: true, End: end, Record: gone(time.Second, 34*time.Second, 34)},
		{Pod: "tolerate-600s", Toleration: "600s", Grace: 10, Planned: t0.Add(25 * time.Second), ByDeadline: true, End: end, Record: gone(25*time.Second, 10*time.Second, 10)},
		{Pod: "tolerate-10s", Toleration: "10s", Grace: 5, Planned: t0.Add(10 * time.Second), End: end, Record: gone(10*time.Second, 5*time.Second, 5)},
		{Pod: "pdb-blocked", Toleration: "none", Grace: 5, Planned: t0, PDB: true, End: end, Record: gone(30*time.Second, 5*time.Second, 5)},
		{Pod: "mirror", Toleration: "none", Grace: 5, Note: "left alone: mirror-pod", End: end},
		// kube-controller-manager's taint eviction, under the NoExecute taint.
		{Pod: "kcm-pdb", Toleration: "none", Grace: 5, Planned: t0, PDB: true, KubeControllerManager: true, End: end, Record: gone(2*time.Second, 5*time.Second, 5)},
		{Pod: "kcm-long", Toleration: "none", Grace: 300, Planned: t0.Add(-265 * time.Second), ByDeadline: true, KubeControllerManager: true, End: end,
			Record: Record{DeletedAt: t0.Add(2 * time.Second), GoneAt: t0.Add(34 * time.Second), Grace: 300, LastGrace: 32}},
		{Pod: "kcm-mirror", Toleration: "none", Grace: 5, Note: "left alone: mirror-pod", KubeControllerManager: true, End: end, Record: gone(time.Second, 5*time.Second, 5)},
	}
	var b bytes.Buffer
	if err := PrintTable(&b, t0, rows); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	line := func(pod string) string {
		for _, l := range strings.Split(out, "\n") {
			if strings.HasPrefix(l, pod+" ") {
				return l
			}
		}
		t.Fatalf("no row for %s in\n%s", pod, out)
		return ""
	}
	for pod, want := range map[string][]string{
		"long-grace":    {"+0.00s", "clamped: 34s of 300s fit", "yes"},
		"tolerate-600s": {"+25.00s", "moved earlier for the window"},
		"tolerate-10s":  {"+10.00s", "at its toleration"},
		"pdb-blocked":   {"+0.00s", "+30.00s", "budget held, then forced"},
		"mirror":        {"left alone: mirror-pod"},
		"kcm-pdb":       {"+0.00s", "+2.00s", "deleted by kube-controller-manager, past its budget"},
		"kcm-long":      {"deleted by kube-controller-manager, grace cut by reprieve to 32s"},
		"kcm-mirror":    {"left alone: mirror-pod", "deleted by kube-controller-manager"},
	} {
		l := line(pod)
		for _, w := range want {
			if !strings.Contains(l, w) {
				t.Errorf("row %q lacks %q", l, w)
			}
		}
	}
	if strings.Contains(out, "-265") || strings.Contains(out, "PLANNED") {
		t.Errorf("a send time before the notice, or the old header:\n%s", out)
	}
	if !strings.Contains(out, "SEND AT:") || !strings.Contains(out, "WHY:") || !strings.Contains(out, "deleted by kube-controller-manager (its") {
		t.Errorf("no legend under the table:\n%s", out)
	}
}
