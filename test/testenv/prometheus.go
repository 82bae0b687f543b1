package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// PrometheusBin returns the path of the prometheus server (Debian's package, which `make promtool`
// installs when missing).
func PrometheusBin() (string, error) {
	p, err := exec.LookPath("prometheus")
	if err != nil {
		return "", fmt.Errorf("prometheus is not installed: run `make promtool` (test/tools/prometheus.sh): %w", err)
	}
	return p, nil
}

// Prometheus is a Prometheus server on loopback.
type Prometheus struct {
	*Process
	URL string
}

// StartPrometheus starts a Prometheus server on 127.0.0.1 that scrapes target (host:port) every
// second as job "reprieve" with a node label, and evaluates ruleFiles every second. It waits
// until the server is ready.
func StartPrometheus(ctx context.Context, logDir, target, node string, ruleFiles ...string) (*Prometheus, error) {
	bin, err := PrometheusBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(logDir, "prometheus-")
	if err != nil {
		return nil, fmt.Errorf("starting prometheus: %w", err)
	}
	rules, _ := json.Marshal(ruleFiles)
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: %s
scrape_configs:
  - job_name: reprieve
    static_configs:
      - targets: [%q]
        labels: {node: %q}
`, rules, target, node)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, fmt.Errorf("writing prometheus config: %w", err)
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p, err := StartProcess(ctx, "prometheus", filepath.Join(logDir, "prometheus.log"), bin, []string{
		"--config.file=" + cfgPath,
		"--storage.tsdb.path=" + filepath.Join(dir, "data"),
		"--web.listen-address=" + addr,
	}, nil)
	if err != nil {
		return nil, err
	}
	prom := &Prometheus{Process: p, URL: "http://" + addr}
	client := &http.Client{Timeout: 2 * time.Second}
	if err := waitReady(ctx, p, 30*time.Second, func(ctx context.Context) error {
		return httpOK(ctx, client, prom.URL+"/-/ready", "")
	}); err != nil {
		_ = p.Stop()
		return nil, err
	}
	return prom, nil
}

// Query runs an instant PromQL query and returns the values of the result vector.
func (p *Prometheus) Query(ctx context.Context, q string) ([]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/api/v1/query?query="+url.QueryEscape(q), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("querying prometheus: %w", err)
	}
	defer resp.Body.Close()
	var body struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("decoding the answer to %q: %w", q, err)
	}
	if body.Status != "success" {
		return nil, fmt.Errorf("query %q: %s", q, body.Error)
	}
	var out []float64
	for _, r := range body.Data.Result {
		s, _ := r.Value[1].(string)
		v, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return nil, fmt.Errorf("query %q: value %q: %w", q, s, err)
		}
		out = append(out, v)
	}
	return out, nil
}
