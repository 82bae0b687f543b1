package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/reprieve-dev/reprieve/agent"
	"github.com/reprieve-dev/reprieve/providers/aws"
	"github.com/reprieve-dev/reprieve/providers/detect"
)

// permission is one RBAC grant the agent uses (deploy/manifests/rbac.yaml).
type permission struct {
	verb, resource, subresource string
}

func (p permission) String() string {
	r := p.resource
	if p.subresource != "" {
		r += "/" + p.subresource
	}
	return p.verb + " " + r
}

// agentPermissions are the verbs the agent uses, cluster-wide (its ClusterRole).
var agentPermissions = []permission{
	{"get", "nodes", ""}, {"list", "nodes", ""}, {"watch", "nodes", ""}, {"patch", "nodes", ""},
	{"list", "pods", ""}, {"watch", "pods", ""}, {"delete", "pods", ""},
	{"create", "pods", "eviction"},
	{"create", "events", ""}, {"patch", "events", ""},
}

// doctorReport collects the checklist.
type doctorReport struct {
	w      io.Writer
	failed int
}

func (r *doctorReport) ok(format string, args ...any) {
	fmt.Fprintf(r.w, "  ok    %s\n", fmt.Sprintf(format, args...))
}

func (r *doctorReport) skip(format string, args ...any) {
	fmt.Fprintf(r.w, "  skip  %s\n", fmt.Sprintf(format, args...))
}

func (r *doctorReport) fail(what, fix string) {
	r.failed++
	fmt.Fprintf(r.w, "  FAIL  %s\n        fix: %s\n", what, fix)
}

// runDoctor implements `reprieve doctor`: it checks, with the agent's flags, everything the
// agent needs on this node and prints a checklist with a fix for each failure. Exit status 1
// when something keeps reprieve from working, 2 for bad flags.
func runDoctor(ctx context.Context, args []string, stdout, stderr io.Writer, clientFor func(agent.Config) (kubernetes.Interface, error)) int {
	sc := newSubcommand("doctor", "[--node NAME] [agent flags]", stderr)
	if code, ok := sc.parse(args); !ok {
		return code
	}
	cfg := sc.cfg

	r := &doctorReport{w: stdout}
	fmt.Fprintf(stdout, "reprieve doctor: node %s, provider %s\n", cfg.NodeName, cfg.Provider)
	client, providerID := checkKubernetes(ctx, r, cfg, clientFor)
	checkMetadata(ctx, r, cfg, client, providerID)
	checkHostRoot(r, cfg)
	checkPressure(ctx, r, cfg, client)
	if r.failed > 0 {
		fmt.Fprintf(stdout, "%d check(s) failed: reprieve cannot do its job on this node until they are fixed.\n", r.failed)
		return 1
	}
	fmt.Fprintln(stdout, "Every check passed.")
	return 0
}

// checkKubernetes checks the API server, each permission and the node; it returns the client
// (nil when there is none) and the node's providerID ("" when unknown).
func checkKubernetes(ctx context.Context, r *doctorReport, cfg agent.Config, clientFor func(agent.Config) (kubernetes.Interface, error)) (kubernetes.Interface, string) {
	client, err := clientFor(cfg)
	if err != nil {
		r.fail(fmt.Sprintf("Kubernetes client: %v", err), "pass --kubeconfig, set $KUBECONFIG, or run in a pod with a ServiceAccount")
		return nil, ""
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	v, err := client.Discovery().ServerVersion()
	if err != nil {
		r.fail(fmt.Sprintf("Kubernetes API server reachable: %v", err), "check the kubeconfig's server address, the network path to it, and its certificate")
		return nil, ""
	}
	r.ok("Kubernetes API server reachable (%s)", v.GitVersion)

	who := "the agent's ServiceAccount"
	if ssr, err := client.AuthenticationV1().SelfSubjectReviews().Create(cctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{}); err == nil {
		who = ssr.Status.UserInfo.Username
		r.ok("authenticated as %s", who)
	}
	perms := agentPermissions
	if cfg.PressureSource == agent.PressureSourceSummary {
		perms = append(slices.Clip(perms), permission{"get", "nodes", "stats"})
	}
	for _, p := range perms {
		review, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(cctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: p.verb, Resource: p.resource, Subresource: p.subresource}},
		}, metav1.CreateOptions{})
		switch {
		case err != nil:
			r.fail(fmt.Sprintf("permission %s: asking the API server: %v", p, err), "check that SelfSubjectAccessReviews can be created (every authenticated user may)")
		case !review.Status.Allowed:
			r.fail(fmt.Sprintf("permission %s: not granted to %s", p, who),
				fmt.Sprintf(`add {apiGroups: [""], resources: [%q], verbs: [%q]} to the ClusterRole bound to %s (deploy/manifests/rbac.yaml)`, strings.TrimSuffix(p.resource+"/"+p.subresource, "/"), p.verb, who))
		default:
			r.ok("permission %s", p)
		}
	}
	n, err := client.CoreV1().Nodes().Get(cctx, cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		r.fail(fmt.Sprintf("node %s: %v", cfg.NodeName, err), "--node-name must be the Kubernetes node's name: in the DaemonSet, NODE_NAME from the downward API (spec.nodeName)")
		return nil, ""
	}
	r.ok("node %s exists (providerID %q)", n.Name, n.Spec.ProviderID)
	return client, n.Spec.ProviderID
}

// checkMetadata asks the cloud's metadata service for its notices once, through the provider
// the agent would use, so that the token, headers and payloads are checked as the agent uses them.
func checkMetadata(ctx context.Context, r *doctorReport, cfg agent.Config, client kubernetes.Interface, providerID string) {
	name := cfg.Provider
	if name == "auto" {
		d := detect.Detect(providerID, cfg.HostRoot)
		r.ok("provider detected: %s (%s)", d.Provider, d.Reason)
		name = d.Provider
	}
	if name == "none" {
		r.skip("metadata service: provider none (the deadline comes from the node annotation %s)", agent.AnnotationReclaimDeadline)
		return
	}
	if name == aws.Name && !checkAWSToken(ctx, r, cfg.AWSIMDSEndpoint) {
		return
	}
	cfg.Provider = name
	if name == "azure" && cfg.AzureResourceName == "" && client == nil {
		// newProvider reads the node for its providerID; without an API server, the node's
		// name stands in for the VM's.
		cfg.AzureResourceName = cfg.NodeName
	}
	p, err := newProvider(klog.NewContext(ctx, klog.Background()), cfg, client, prometheus.NewRegistry())
	if err != nil {
		r.fail(fmt.Sprintf("metadata service (%s): %v", name, err), "check the --"+name+"-* endpoint flags")
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	notices, err := p.Poll(pctx)
	if err != nil {
		r.fail(fmt.Sprintf("metadata service (%s) answering as the cloud does: %v", name, err), metadataFix(name))
		return
	}
	r.ok("metadata service (%s) answers; %d notice(s) in force now", name, len(notices))
}

// checkAWSToken asks IMDSv2 for a token with a short timeout: a token request that times out
// while the endpoint accepts connections is the hop-limit symptom.
func checkAWSToken(ctx context.Context, r *doctorReport, endpoint string) bool {
	tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(tctx, http.MethodPut, strings.TrimSuffix(endpoint, "/")+"/latest/api/token", nil)
	if err != nil {
		r.fail(fmt.Sprintf("--aws-imds-endpoint %q: %v", endpoint, err), "give a URL such as http://169.254.169.254")
		return false
	}
	req.Header.Set("X-aws-ec2-metadata-token-ttl-seconds", "60")
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.Proxy = nil
	resp, err := (&http.Client{Transport: transport}).Do(req)
	switch {
	case errors.Is(err, context.DeadlineExceeded) || (err != nil && strings.Contains(err.Error(), "Client.Timeout")):
		r.fail(fmt.Sprintf("IMDSv2 token from %s: no answer in 2 s", endpoint),
			"the hop-limit symptom: IMDSv2 answers token requests with an IP hop limit of 1 by default, which a pod network drops; run the DaemonSet with hostNetwork: true (the AWS manifest does) or set the instances' HttpPutResponseHopLimit to 2")
		return false
	case err != nil:
		r.fail(fmt.Sprintf("IMDSv2 token from %s: %v", endpoint, err), metadataFix(aws.Name))
		return false
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		r.fail(fmt.Sprintf("IMDSv2 token from %s: HTTP %d", endpoint, resp.StatusCode), "IMDS must be enabled with IMDSv2 (HttpTokens required or optional, HttpEndpoint enabled)")
		return false
	}
	r.ok("IMDSv2 token from %s", endpoint)
	return true
}

func metadataFix(provider string) string {
	switch provider {
	case aws.Name:
		return "reprieve must run on an EC2 instance with IMDS enabled (HttpEndpoint enabled); check --aws-imds-endpoint and that no proxy or network policy blocks 169.254.169.254"
	case "gcp":
		return "reprieve must run on a GCE VM; check --gcp-metadata-endpoint ($GCE_METADATA_HOST) and that metadata.google.internal resolves and answers with Metadata-Flavor: Google"
	default:
		return "reprieve must run on an Azure VM; check --azure-imds-endpoint and that no proxy or network policy blocks 169.254.169.254 (IMDS refuses proxied requests)"
	}
}

// checkHostRoot checks that the host's filesystem is readable where --host-root says.
func checkHostRoot(r *doctorReport, cfg agent.Config) {
	entries, err := os.ReadDir(cfg.HostRoot)
	if err != nil {
		r.fail(fmt.Sprintf("--host-root %s: %v", cfg.HostRoot, err), "mount the host's / read-only into the pod and pass its path (the DaemonSet uses /host)")
		return
	}
	r.ok("--host-root %s readable (%d entries)", cfg.HostRoot, len(entries))
}

// checkPressure reads the kubelet's thresholds and the pressure signals once, as the agent
// would, and prints each signal against reprieve's and the kubelet's thresholds.
func checkPressure(ctx context.Context, r *doctorReport, cfg agent.Config, client kubernetes.Interface) {
	if cfg.PressureSource == agent.PressureSourceOff {
		r.skip("local pressure: --pressure-source off")
		return
	}
	thresholds, kc, kcErr, err := agent.PressureThresholds(cfg)
	if err != nil {
		r.fail(fmt.Sprintf("pressure thresholds: %v", err), "give the thresholds in the kubelet's syntax, e.g. memory.available<500Mi,nodefs.available<15%")
		return
	}
	if kcErr != nil {
		r.fail(kcErr.Error(), "fix the kubelet's config file, or point --kubelet-config at it (a path under --host-root)")
		return
	}
	var hard []string
	for _, t := range kc.Hard {
		hard = append(hard, t.String())
	}
	if kc.Found {
		r.ok("kubelet config %s: evictionHard %s", kc.Path, strings.Join(hard, ","))
	} else {
		r.ok("kubelet config %s not found: the kubelet's defaults apply (evictionHard %s)", kc.Path, strings.Join(hard, ","))
	}
	var node *v1.Node
	if cfg.PressureSource == agent.PressureSourceSummary && cfg.KubeletSummaryURL == "" && client != nil {
		if node, err = client.CoreV1().Nodes().Get(ctx, cfg.NodeName, metav1.GetOptions{}); err != nil {
			r.fail(fmt.Sprintf("kubelet Summary API: reading node %s: %v", cfg.NodeName, err), "pass --kubelet-summary-url")
			return
		}
	}
	src, _, err := agent.NewPressureSource(cfg, node)
	if err != nil {
		r.fail(fmt.Sprintf("kubelet Summary API: %v", err), "pass --kubelet-summary-url, and check --kubelet-ca-file and --kubelet-token-file")
		return
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	sample, err := src.Read(rctx)
	if err != nil {
		fix := "mount the host's / read-only at --host-root (the DaemonSet uses /host), and check --kubelet-root-dir and --imagefs-dir"
		if cfg.PressureSource == agent.PressureSourceSummary {
			fix = "grant get on nodes/stats, check that the kubelet's port is reachable from the pod and its certificate (--kubelet-ca-file, --kubelet-insecure-tls)"
		}
		r.fail(fmt.Sprintf("pressure signals (%s): %v", cfg.PressureSource, err), fix)
		if len(sample.Node) == 0 {
			return
		}
	}
	levels := thresholds.Levels(sample.Node)
	for _, l := range levels {
		f := func(v int64) string { return agent.FormatAmount(l.Signal, v) }
		if l.Hard > 0 && l.Threshold <= l.Hard {
			r.fail(fmt.Sprintf("%s: reprieve's threshold %s is not above the kubelet's hard threshold %s, so the kubelet evicts first", l.Signal, f(l.Threshold), f(l.Hard)),
				"raise it in --pressure-thresholds, or leave that flag empty to derive thresholds from the kubelet's plus --pressure-headroom")
			continue
		}
		state := "ok"
		if l.Available < l.Threshold {
			state = "UNDER PRESSURE"
		}
		r.ok("%s %s of %s (reprieve's threshold %s, the kubelet's hard %s): %s", l.Signal, f(l.Available), f(l.Capacity), f(l.Threshold), f(l.Hard), state)
	}
}
