package aws

import (
	"testing"

	"github.com/reprieve-dev/reprieve/providers"
)

// The fuzz targets below feed IMDS payloads to the parsers: none may panic, and whatever they
// accept is a well-formed notice. Seeds are documents AWS serves and near misses; make test runs
// each target briefly (make fuzz), longer runs: go test -run '^$' -fuzz FuzzX ./providers/aws.

func FuzzParseSpotInstanceAction(f *testing.F) {
	for _, s := range []string{
		`{"action": "terminate", "time": "2026-12-01T10:00:00Z"}`,
		`{"action": "stop", "time": "2026-12-01T10:00:00+02:00"}`,
		`{"action": "hibernate", "time": ""}`,
		`{"action": "reboot", "time": "2026-12-01T10:00:00Z"}`,
		`{"action": "terminate"`,
		`<html>404</html>`,
		`null`, `[]`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		ns, err := ParseSpotInstanceAction(body)
		if err != nil {
			if ns != nil {
				t.Errorf("notices %v with error %v", ns, err)
			}
			return
		}
		if len(ns) != 1 {
			t.Fatalf("%d notices from one document", len(ns))
		}
		n := ns[0]
		if n.Kind != providers.KindSpotInterruption || n.ID == "" || n.Deadline.IsZero() || !n.Interrupts() {
			t.Errorf("accepted %q as a malformed notice %+v", body, n)
		}
	})
}

func FuzzParseRebalance(f *testing.F) {
	for _, s := range []string{`{"noticeTime": "2026-12-01T10:00:00Z"}`, `{"noticeTime": "yesterday"}`, `{}`, `{`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		ns, err := ParseRebalance(body)
		if err != nil {
			return
		}
		if len(ns) != 1 || ns[0].Interrupts() || ns[0].NoticeTime.IsZero() || ns[0].ID == "" {
			t.Errorf("accepted %q as %+v; want one soft notice with its time", body, ns)
		}
	})
}

func FuzzParseScheduledEvents(f *testing.F) {
	for _, s := range []string{
		`[{"NotBefore": "21 Jan 2026 09:00:43 GMT", "Code": "system-reboot", "Description": "scheduled reboot", "EventId": "instance-event-0d59937288b749b32", "NotAfter": "21 Jan 2026 09:17:23 GMT", "State": "active"}]`,
		`[{"NotBefore": "21 Jan 2026 09:00:43 GMT", "Code": "instance-stop", "State": "completed"}]`,
		`[{"NotBefore": "soon", "State": "active"}]`,
		`[]`, `{}`, `[`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		ns, _ := ParseScheduledEvents(body)
		for _, n := range ns {
			if n.Kind != providers.KindScheduledMaintenance || n.ID == "" || n.Deadline.IsZero() {
				t.Errorf("accepted %q as a malformed notice %+v", body, n)
			}
		}
	})
}
