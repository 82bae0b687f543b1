package testenv

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// imdsReadyTimeout bounds how long StartIMDSMock waits for the mock to answer.
const imdsReadyTimeout = 15 * time.Second

// StartIMDSMock starts amazon-ec2-metadata-mock on 127.0.0.1 at a free port, for any number
// of clients (--mock-ip-count=-1), followed by args, and waits until it answers HTTP. args
// may hold global flags and a subcommand with its flags, for example
//
//	"-I", "spot", "-a", "terminate", "-t", "2026-11-29T12:00:00Z"
//
// (-I makes it require IMDSv2 tokens; -d N or --mock-trigger-time delays the notice). Its
// log goes to ec2-metadata-mock-<port>.log in logDir (a new temporary folder when logDir is
// empty). It returns the process and the endpoint, "http://127.0.0.1:<port>". Stop the
// process when done.
func StartIMDSMock(ctx context.Context, logDir string, args ...string) (*Process, string, error) {
	bin, err := ToolsBin()
	if err != nil {
		return nil, "", fmt.Errorf("starting ec2-metadata-mock: %w", err)
	}
	if logDir == "" {
		if logDir, err = os.MkdirTemp("", "reprieve-imds-mock-"); err != nil {
			return nil, "", fmt.Errorf("starting ec2-metadata-mock: creating a log folder: %w", err)
		}
	}
	port, err := FreePort()
	if err != nil {
		return nil, "", fmt.Errorf("starting ec2-metadata-mock: %w", err)
	}
	// The bind flags are persistent (global) flags, so they may precede a subcommand; the
	// --flag=value form keeps -1 from being read as a flag.
	all := append([]string{
		"--hostname=127.0.0.1",
		"--port=" + strconv.Itoa(port),
		"--mock-ip-count=-1",
	}, args...)
	logPath := filepath.Join(logDir, fmt.Sprintf("ec2-metadata-mock-%d.log", port))
	p, err := StartProcess(ctx, "ec2-metadata-mock", logPath, filepath.Join(bin, IMDSMockBin), all, nil)
	if err != nil {
		return nil, "", err
	}
	endpoint := "http://127.0.0.1:" + strconv.Itoa(port)
	client := &http.Client{Timeout: 2 * time.Second}
	if err := waitReady(ctx, p, imdsReadyTimeout, func(ctx context.Context) error {
		// Any HTTP answer (404, 401 under -I) means it is serving.
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, endpoint+"/latest/meta-data/", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		return resp.Body.Close()
	}); err != nil {
		_ = p.Stop()
		return nil, "", fmt.Errorf("starting ec2-metadata-mock: %w", err)
	}
	return p, endpoint, nil
}
