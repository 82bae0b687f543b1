package agent

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/reprieve-dev/reprieve/agent/pressure"
	"github.com/reprieve-dev/reprieve/kubelet"
	v1 "k8s.io/api/core/v1"
)

// PressureThresholds reads what the levels are computed from: reprieve's thresholds from the
// flags and the kubelet's from its config file under --host-root. A flag that does not parse is
// err; a kubelet config that cannot be read or parsed is kubeletErr (the thresholds then hold
// the kubelet's defaults), which turns only the pressure handling off.
func PressureThresholds(cfg Config) (t pressure.Thresholds, kc kubelet.Config, kubeletErr, err error) {
	explicit, headroom, reclaim, err := cfg.PressureThresholdsOf()
	if err != nil {
		return t, kc, nil, err
	}
	kc, kubeletErr = kubelet.ReadConfig(filepath.Join(cfg.HostRoot, cfg.KubeletConfig))
	if kubeletErr != nil {
		kubeletErr = fmt.Errorf("reading the kubelet's eviction thresholds: %w", kubeletErr)
	}
	if reclaim == nil {
		reclaim = kc.MinimumReclaim
	}
	return pressure.Thresholds{Explicit: explicit, Headroom: headroom, Hard: kc.Hard, Soft: kc.Soft, MinReclaim: reclaim}, kc, kubeletErr, nil
}

// NewPressureSource builds the source --pressure-source names. For the Summary API without
// --kubelet-summary-url, node gives the kubelet's address. It also returns what it reads from.
func NewPressureSource(cfg Config, node *v1.Node) (kubelet.Source, string, error) {
	if cfg.PressureSource == PressureSourceHost {
		return &kubelet.HostSource{Root: cfg.HostRoot, KubeletRootDir: cfg.KubeletRootDir, ImageFsDir: cfg.ImageFsDir}, cfg.HostRoot, nil
	}
	url := cfg.KubeletSummaryURL
	if url == "" {
		if node == nil {
			return nil, "", errors.New("finding the kubelet's Summary API: node not found; set --kubelet-summary-url")
		}
		var err error
		if url, err = SummaryURL(node); err != nil {
			return nil, "", err
		}
	}
	token := cfg.KubeletTokenFile
	if _, err := os.Stat(token); err != nil {
		token = ""
	}
	ca := cfg.KubeletCAFile
	if _, err := os.Stat(ca); err != nil || cfg.KubeletInsecureTLS {
		// Outside a pod (or with a plain-HTTP test server) there is no in-cluster CA: the
		// system's roots verify the kubelet then.
		ca = ""
	}
	src, err := kubelet.NewSummarySource(url, ca, token, cfg.KubeletInsecureTLS)
	if err != nil {
		return nil, "", fmt.Errorf("setting up the kubelet's Summary API client: %w", err)
	}
	return src, url, nil
}

// SummaryURL is the kubelet's Summary API on the node's InternalIP and kubelet port.
func SummaryURL(node *v1.Node) (string, error) {
	port := int(node.Status.DaemonEndpoints.KubeletEndpoint.Port)
	if port == 0 {
		port = 10250
	}
	for _, addr := range node.Status.Addresses {
		if addr.Type == v1.NodeInternalIP {
			return "https://" + net.JoinHostPort(addr.Address, strconv.Itoa(port)) + "/stats/summary", nil
		}
	}
	return "", fmt.Errorf("finding the kubelet's Summary API: node %s has no InternalIP; set --kubelet-summary-url", node.Name)
}
