package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"k8s.io/klog/v2"
)

// TestJSONLogs: with --log-format=json every line the agent's contextual logger writes is one
// JSON object with the message and the structured keys, -v gates verbose lines, and errors
// carry the error text.
func TestJSONLogs(t *testing.T) {
	var buf bytes.Buffer
	if err := setupLogging("json", 1, &buf); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(klog.ClearLogger)
	logger := klog.Background()
	logger.Info("Tainted the node", "node", klog.KRef("", "n1"), "taint", "cloud=spot:NoExecute")
	logger.V(1).Info("Polled", "outcome", "none")
	logger.V(2).Info("Too verbose for -v=1")
	logger.Error(errors.New("connection refused"), "Polling the metadata service")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3 (the V(2) line dropped at -v=1):\n%s", len(lines), buf.String())
	}
	var first map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &first); err != nil {
		t.Fatalf("line %q is not JSON: %v", lines[0], err)
	}
	if first["msg"] != "Tainted the node" || first["level"] != "INFO" || first["taint"] != "cloud=spot:NoExecute" {
		t.Errorf("first line %v: want msg, level INFO, node n1 and the taint", first)
	}
	if node, _ := first["node"].(map[string]any); node["name"] != "n1" {
		t.Errorf("node %v, want an object with name n1 (as klog's own JSON format writes a KRef)", first["node"])
	}
	if _, ok := first["time"]; !ok {
		t.Errorf("first line %v has no time", first)
	}
	var verbose, failed map[string]any
	if err := json.Unmarshal([]byte(lines[1]), &verbose); err != nil || verbose["level"] != "INFO" || verbose["outcome"] != "none" {
		t.Errorf("V(1) line %q (%v): want level INFO and outcome none", lines[1], err)
	}
	if err := json.Unmarshal([]byte(lines[2]), &failed); err != nil || failed["level"] != "ERROR" || failed["err"] != "connection refused" {
		t.Errorf("error line %q (%v): want level ERROR and err", lines[2], err)
	}
}

func TestLogFormatRejectsUnknown(t *testing.T) {
	if err := setupLogging("xml", 0, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "xml") {
		t.Errorf("setupLogging(xml) = %v, want an error naming the value", err)
	}
}
