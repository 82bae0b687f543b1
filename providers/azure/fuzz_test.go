package azure

import (
	"testing"
)

// FuzzParseDocument feeds Scheduled Events payloads to the decoder: it must not panic, and what
// it accepts must have been a JSON object with both DocumentIncarnation and Events (anything
// else would read as "no events" and withdraw every notice).
func FuzzParseDocument(f *testing.F) {
	for _, s := range []string{
		`{"DocumentIncarnation": 1, "Events": [{"EventId": "602d9444-d2cd-49c7-8624-8643e7171297", "EventType": "Preempt", "ResourceType": "VirtualMachine", "Resources": ["vm1"], "EventStatus": "Scheduled", "NotBefore": "Mon, 19 Sep 2016 18:29:47 GMT", "Description": "", "EventSource": "Platform", "DurationInSeconds": -1}]}`,
		`{"DocumentIncarnation": "2", "Events": []}`,
		`{"DocumentIncarnation": 3}`,
		`{"Events": []}`,
		`{"error": "Bad request"}`,
		`null`, `[]`, `<html></html>`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		doc, err := ParseDocument(body)
		if err != nil {
			return
		}
		if doc.Events == nil {
			t.Errorf("accepted %q with nil Events", body)
		}
		for _, ev := range doc.Events {
			if ev.NotBefore != "" {
				_, _ = parseNotBefore(ev.NotBefore) // must not panic either
			}
		}
	})
}
