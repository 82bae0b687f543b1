package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/nodefacts"
	"github.com/reprieve-dev/reprieve/agent/preflight"
	"github.com/reprieve-dev/reprieve/agent/pressure"
	"github.com/reprieve-dev/reprieve/agent/record"
	"github.com/reprieve-dev/reprieve/agent/volumes"
	"github.com/reprieve-dev/reprieve/agent/whatif"

	"github.com/prometheus/client_golang/prometheus"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/reprieve-dev/reprieve/agent"
	"github.com/reprieve-dev/reprieve/kubelet"
	"github.com/reprieve-dev/reprieve/providers"
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

// agentReads are the verbs the agent uses for one part of its report alone: without them it
// still works, and says what it cannot tell (a warning here, not a failure). group is the
// permission's API group ("" the core group).
var agentReads = []struct {
	permission
	group, without string
}{
	{permission{"get", "persistentvolumeclaims", ""}, "", "the window's summary says each pod's volumes are unknown"},
	{permission{"get", "persistentvolumes", ""}, "", "the window's summary says each pod's volumes are unknown"},
	{permission{"get", "csidrivers", ""}, "storage.k8s.io", "a volume of a driver that attaches to no node (EFS, Azure File) is taken for one that attaches, and reported as never seen in use"},
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

func (r *doctorReport) warn(format string, args ...any) {
	fmt.Fprintf(r.w, "  WARN  %s\n", fmt.Sprintf(format, args...))
}

func (r *doctorReport) fail(what, fix string) {
	r.failed++
	fmt.Fprintf(r.w, "  FAIL  %s\n        fix: %s\n", what, fix)
}

// runDoctor implements `reprieve doctor`: it checks, with the agent's flags, everything the
// agent needs on this node and prints a checklist with a fix for each failure. Exit status 1
// when something keeps reprieve from working, 2 for bad flags.
func runDoctor(ctx context.Context, args []string, stdout, stderr io.Writer, clientFor func(config.Config) (kube.Interface, error)) int {
	sc := newSubcommand("doctor", "[--node NAME] [agent flags]", stderr)
	if code, ok := sc.parse(args); !ok {
		return code
	}
	cfg := sc.cfg

	r := &doctorReport{w: stdout}
	fmt.Fprintf(stdout, "reprieve doctor: node %s, provider %s\n", cfg.NodeName, cfg.Provider)
	fmt.Fprintf(stdout, "%s\n", whatif.EvictionSummary(cfg))
	client, node := checkKubernetes(ctx, r, cfg, clientFor)
	checkMetadata(ctx, r, cfg, node)
	checkOverlaps(ctx, r, cfg, client, node)
	checkGuardPlacement(ctx, r, client)
	checkVolumePlugins(ctx, r, cfg, client)
	checkHostRoot(r, cfg)
	// One read of the kubelet's configuration, as the agent makes one, for every check that
	// uses it.
	kr := kubelet.Find(cfg.KubeletLookup())
	checkKubeletConfig(r, cfg, kr)
	checkPressure(ctx, r, cfg, kr, client)
	if r.failed > 0 {
		fmt.Fprintf(stdout, "%d check(s) failed: reprieve cannot do its job on this node until they are fixed.\n", r.failed)
		return 1
	}
	fmt.Fprintln(stdout, "Every check passed.")
	return 0
}

// checkOverlaps lists the other programs that act on this node's interruptions too
// (nodefacts.Overlaps), from the node and its pods, as warnings: the operator picks one per node.
func checkOverlaps(ctx context.Context, r *doctorReport, cfg config.Config, client kube.Interface, node *v1.Node) {
	if node == nil || client == nil {
		r.skip("other interruption handlers: the node could not be read")
		return
	}
	pods := nodePods(ctx, client, cfg.NodeName)
	if pods == nil {
		r.warn("other interruption handlers: the node's pods could not be read; judged from the node alone")
	}
	overlaps := nodefacts.Overlaps(node, pods)
	if len(overlaps) == 0 {
		r.ok("no other interruption handler seen on node %s (Karpenter, an EKS managed node group, AKS node auto-drain, aws-node-termination-handler)", cfg.NodeName)
		return
	}
	for _, o := range overlaps {
		r.warn("%s", o)
	}
}

// checkKubernetes checks the API server, each permission and the node; it returns the client
// (nil when there is none) and the node (nil when unknown).
func checkKubernetes(ctx context.Context, r *doctorReport, cfg config.Config, clientFor func(config.Config) (kube.Interface, error)) (kube.Interface, *v1.Node) {
	client, err := clientFor(cfg)
	if err != nil {
		r.fail(fmt.Sprintf("Kubernetes client: %v", err), "pass --kubeconfig, set $KUBECONFIG, or run in a pod with a ServiceAccount")
		return nil, nil
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	v, err := client.Discovery().ServerVersion()
	if err != nil {
		r.fail(fmt.Sprintf("Kubernetes API server reachable: %v", err), "check the kubeconfig's server address, the network path to it, and its certificate")
		return nil, nil
	}
	r.ok("Kubernetes API server reachable (%s)", v.GitVersion)

	who := "the agent's ServiceAccount"
	var user *authenticationv1.UserInfo
	if ssr, err := client.AuthenticationV1().SelfSubjectReviews().Create(cctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{}); err == nil {
		user = &ssr.Status.UserInfo
		who = user.Username
		r.ok("authenticated as %s", who)
	}
	perms := agentPermissions
	if cfg.PressureSource == config.PressureSourceSummary {
		perms = append(slices.Clip(perms), permission{"get", "nodes", "stats"})
	}
	allowed := func(p permission, group string) (bool, error) {
		review, err := client.AuthorizationV1().SelfSubjectAccessReviews().Create(cctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: p.verb, Group: group, Resource: p.resource, Subresource: p.subresource}},
		}, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		return review.Status.Allowed, nil
	}
	grant := func(p permission, group string) string {
		return fmt.Sprintf(`add {apiGroups: [%q], resources: [%q], verbs: [%q]} to the ClusterRole bound to %s (deploy/manifests/rbac.yaml)`, group, strings.TrimSuffix(p.resource+"/"+p.subresource, "/"), p.verb, who)
	}
	for _, p := range perms {
		ok, err := allowed(p, "")
		switch {
		case err != nil:
			r.fail(fmt.Sprintf("permission %s: asking the API server: %v", p, err), "check that SelfSubjectAccessReviews can be created (every authenticated user may)")
		case !ok:
			r.fail(fmt.Sprintf("permission %s: not granted to %s", p, who), grant(p, ""))
		default:
			r.ok("permission %s", p)
		}
	}
	for _, p := range agentReads {
		ok, err := allowed(p.permission, p.group)
		switch {
		case err != nil:
			r.warn("permission %s: asking the API server: %v", p.permission, err)
		case !ok:
			r.warn("permission %s: not granted to %s: %s; %s", p.permission, who, p.without, grant(p.permission, p.group))
		default:
			r.ok("permission %s", p.permission)
		}
	}
	n, err := client.CoreV1().Nodes().Get(cctx, cfg.NodeName, metav1.GetOptions{})
	if err != nil {
		r.fail(fmt.Sprintf("node %s: %v", cfg.NodeName, err), "--node-name must be the Kubernetes node's name: in the DaemonSet, NODE_NAME from the downward API (spec.nodeName)")
		return nil, nil
	}
	r.ok("node %s exists (providerID %q)", n.Name, n.Spec.ProviderID)
	claim := checkNodeClaim(r, cfg, user)
	checkNodeWrite(cctx, r, cfg, client, claim)
	checkEviction(cctx, r, cfg, client)
	return client, n
}

// nodeClaim is the extra that the API server puts in a ServiceAccount token bound to a pod: the
// pod's node. The shipped admission policies bind every write of the agent to it.
const nodeClaim = "authentication.kubernetes.io/node-name"

// checkNodeClaim reports the token's node claim from the SelfSubjectReview: present and naming
// this node (ok), naming another node (fail: every write would be refused), or absent (a token
// not bound to a pod, or a cluster that turned ServiceAccountTokenPodNodeInfo off; the dry-run
// write says whether the policy refuses it). It returns the claim ("" when absent or unknown).
func checkNodeClaim(r *doctorReport, cfg config.Config, user *authenticationv1.UserInfo) string {
	if user == nil {
		r.skip("token's node claim: SelfSubjectReview unavailable")
		return ""
	}
	if !strings.HasPrefix(user.Username, "system:serviceaccount:") {
		r.skip("token's node claim: %s is not a ServiceAccount (the admission policies bind only the agent's)", user.Username)
		return ""
	}
	claim := user.Extra[nodeClaim]
	switch {
	case len(claim) == 0:
		r.warn("the token has no node claim (%s): the shipped admission policy refuses every node write and pod delete from such a token", nodeClaim)
		return ""
	case claim[0] != cfg.NodeName:
		r.fail(fmt.Sprintf("the token is bound to node %s, not %s: the admission policy refuses this agent's writes", claim[0], cfg.NodeName),
			"--node-name must be the node of the pod whose token the agent uses: NODE_NAME from the downward API (spec.nodeName)")
		return claim[0]
	}
	r.ok("token bound to node %s (%s)", claim[0], nodeClaim)
	return claim[0]
}

// claimFix is the fix for writes refused for want of the node claim.
const claimFix = "run the agent with the token the kubelet projects into its pod (bound to the pod, so it carries " + nodeClaim +
	"; Kubernetes 1.32 and later always adds it, 1.30 and 1.31 unless the ServiceAccountTokenPodNodeInfo feature gate is off), " +
	"or set admissionPolicy.enabled=false in the chart (docs/install.md says what that leaves unbound)"

// checkNodeWrite patches the node with a server-side dry run: the same RBAC and admission as the
// agent's taint writes, and no change.
func checkNodeWrite(ctx context.Context, r *doctorReport, cfg config.Config, client kube.Interface, claim string) {
	_, err := client.CoreV1().Nodes().Patch(ctx, cfg.NodeName, types.MergePatchType, []byte("{}"), metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
	switch {
	case err == nil:
		r.ok("node %s may be patched (server-side dry run)", cfg.NodeName)
		if claim == "" {
			r.warn("writes pass without a node claim: the admission policies are not in force here, so this token could write any node")
		}
	case apierrors.IsForbidden(err) && claim == "":
		r.fail(fmt.Sprintf("patching node %s (dry run): %v", cfg.NodeName, err), claimFix)
	default:
		r.fail(fmt.Sprintf("patching node %s (dry run): %v", cfg.NodeName, err),
			`grant patch on nodes (deploy/manifests/rbac.yaml), and check that the admission policies were installed for this ServiceAccount's name`)
	}
}

// checkEviction evicts one pod of the node with a server-side dry run, as the agent would (grace
// and UID precondition), through RBAC, the admission policies and the eviction guard where it is
// installed. A PodDisruptionBudget that refuses now is not a failure.
func checkEviction(ctx context.Context, r *doctorReport, cfg config.Config, client kube.Interface) {
	pods, err := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String(), Limit: 20})
	if err != nil {
		r.fail(fmt.Sprintf("listing the pods of node %s: %v", cfg.NodeName, err), "grant list on pods (deploy/manifests/rbac.yaml)")
		return
	}
	var pod *v1.Pod
	for i := range pods.Items {
		if p := &pods.Items[i]; p.DeletionTimestamp == nil && (pod == nil || pod.Name == os.Getenv("POD_NAME")) {
			// Any pod of the node; another than the agent's own where there is one.
			pod = p
		}
	}
	if pod == nil {
		r.skip("eviction (dry run): no pod on node %s to try", cfg.NodeName)
		return
	}
	// The agent's own dry run and its reading of the answer (agent/preflight); a pod that went
	// away meanwhile, or was replaced under its name, is not the path's answer.
	err = preflight.DryRunEvict(ctx, client, pod.Namespace, pod.Name, pod.UID)
	status, _ := preflight.Verdict(err)
	switch {
	case err == nil:
		r.ok("pod %s/%s may be evicted (server-side dry run)", pod.Namespace, pod.Name)
	case preflight.BudgetRefuses(err):
		r.ok("pod %s/%s may be evicted; a PodDisruptionBudget refuses it now (server-side dry run)", pod.Namespace, pod.Name)
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		r.skip("eviction (dry run): pod %s/%s went away meanwhile", pod.Namespace, pod.Name)
	case status == preflight.StatusGuardUnreachable:
		r.fail(fmt.Sprintf("the eviction guard is unreachable: evicting pod %s/%s (dry run): %v", pod.Namespace, pod.Name, err), guardUnreachableFix)
	default:
		r.fail(fmt.Sprintf("evicting pod %s/%s (dry run): %v", pod.Namespace, pod.Name, err),
			"grant create on pods/eviction; with the eviction guard (evictionGuard.enabled), check that its pods are ready (an unreachable guard refuses every eviction, and the agent falls back to a node-bound DELETE at each pod's last safe moment)")
	}
}

// checkMetadata asks the cloud's metadata service for its notices once, through the provider
// the agent would use, so that the token, headers and payloads are checked as the agent uses them.
func checkMetadata(ctx context.Context, r *doctorReport, cfg config.Config, node *v1.Node) {
	choice := providerChoice{name: cfg.Provider}
	providerID := ""
	if node != nil {
		providerID = node.Spec.ProviderID
		// As the agent does once it has read the node.
		accel := &nodefacts.AcceleratorHolder{}
		accel.Set(node)
		choice.nodeAccelerator = accel.Get
	}
	if choice.name == "auto" {
		// As the agent decides (chooseProvider): DMI first, then the node's providerID.
		d, ok := detect.FromHost(cfg.HostRoot)
		if !ok {
			d = detect.Detect(providerID, cfg.HostRoot)
			choice.providerID = providerID
		}
		r.ok("provider detected: %s (%s)", d.Provider, d.Reason)
		choice.name, choice.reason = d.Provider, d.Reason
	}
	name := choice.name
	if name == "none" {
		r.skip("metadata service: provider none (the deadline comes from the node annotation %s)", record.AnnotationReclaimDeadline)
		return
	}
	if name == aws.Name && !checkAWSToken(ctx, r, cfg.AWSIMDSEndpoint) {
		return
	}
	// Without --azure-resource-name the provider asks IMDS compute.name, as the agent's does
	// when the node gives no name.
	p, err := newProvider(klog.NewContext(ctx, klog.Background()), cfg, choice, prometheus.NewRegistry())
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
	// Each source on its own, as readiness judges them (docs/operations.md, "Readiness"): one
	// that has not answered leaves the agent not Ready.
	if sr, ok := p.(providers.SourceReporter); ok {
		answered := sr.Answered()
		for _, src := range slices.Sorted(maps.Keys(answered)) {
			if answered[src] {
				r.ok("metadata source %s answers", src)
			} else {
				r.fail(fmt.Sprintf("metadata source %s gave no good answer: the agent would not be Ready", src), metadataFix(name))
			}
		}
	}
	// Which windows apply and where they came from (issue 21): a GPU VM's hour of maintenance
	// notice or an ordinary VM's minute, an extended preemption notice or none.
	if wr, ok := p.(providers.WindowReporter); ok {
		for _, w := range wr.Windows() {
			r.ok("window: %s: %s (%s)", w.Name, w.Duration, w.Source)
		}
	}
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
func checkHostRoot(r *doctorReport, cfg config.Config) {
	entries, err := os.ReadDir(cfg.HostRoot)
	if err != nil {
		r.fail(fmt.Sprintf("--host-root %s: %v", cfg.HostRoot, err), "mount the host's / read-only into the pod and pass its path (the DaemonSet uses /host)")
		return
	}
	r.ok("--host-root %s readable (%d entries)", cfg.HostRoot, len(entries))
}

// checkKubeletConfig reads the kubelet's configuration as the agent would (its eviction
// thresholds and graceful node shutdown), with pressure handling off too: the interruption plan
// uses the shutdown grace. Not found fails: the agent then assumes the kubelet's defaults, which
// on a managed platform are not what its kubelet runs with.
func checkKubeletConfig(r *doctorReport, cfg config.Config, kr kubelet.ConfigRead) {
	kc, err := kr.Config, kr.Err
	if err != nil {
		what := "reading the kubelet's configuration"
		if cfg.PressureSource != config.PressureSourceOff {
			what = "reading the kubelet's eviction thresholds" // as the agent's PressureDisabled event says
		}
		r.fail(fmt.Sprintf("%s: %v (its eviction thresholds and graceful node shutdown are unknown)", what, err),
			"fix the kubelet's config file or drop-in, or point --kubelet-config (and --kubelet-config-dir) at the kubelet's own (paths under --host-root)")
		return
	}
	hard := kubeletThresholds(kc)
	if !kc.Found {
		var known []string
		for _, l := range kubelet.Locations {
			known = append(known, l.Platform+" "+l.Path)
		}
		r.fail(fmt.Sprintf("kubelet configuration not found (tried %s): the kubelet's eviction thresholds and graceful node shutdown are unknown; "+
			"reprieve assumes the kubelet's defaults (evictionHard %s) and no graceful node shutdown", strings.Join(kc.Searched, ", "), hard),
			agent.KubeletConfigFix+"; or mount the platform's path under --host-root ("+strings.Join(known, ", ")+")")
		return
	}
	where := kc.Path
	if kc.Platform != "" {
		where += " (" + kc.Platform + ")"
	}
	if len(kc.DropIns) > 0 {
		where += " with the drop-ins " + strings.Join(kc.DropIns, ", ")
	}
	shutdown := "off"
	if kc.ShutdownGracePeriod > 0 {
		shutdown = fmt.Sprintf("%s (%s of it for critical pods)", kc.ShutdownGracePeriod, kc.ShutdownGracePeriodCriticalPods)
	}
	r.ok("kubelet config %s: evictionHard %s; graceful node shutdown %s", where, hard, shutdown)
	// What the volume rule takes from it: how long before the deadline a pod with a volume
	// that attaches must be gone (the kubelet's status period).
	release, from := volumes.ReleaseOf(cfg, kr)
	r.ok("volume release: a pod with a volume that attaches is gone %s before the deadline (%s)", release, from)
}

// kubeletThresholds writes the kubelet's eviction thresholds as its eviction manager holds them:
// evictionHard as configured, then the allocatableMemory.available copies of its memory.available
// threshold when enforceNodeAllocatable holds pods (kubelet.Config.EvictionHard, as the kubelet's
// addAllocatableThresholds), which is the signal that fires first on a node whose reservation is
// larger than what the system uses; and evictionSoft with its grace periods when there is one.
func kubeletThresholds(kc kubelet.Config) string {
	s := thresholdList(kc.Hard)
	all, _ := kc.EvictionHard()
	var copies []kubelet.Threshold
	for _, t := range all {
		if !slices.ContainsFunc(kc.Hard, func(h kubelet.Threshold) bool { return h.String() == t.String() }) {
			copies = append(copies, t)
		}
	}
	hasMemory := slices.ContainsFunc(kc.Hard, func(h kubelet.Threshold) bool { return h.Signal == kubelet.MemoryAvailable })
	switch {
	case len(copies) > 0:
		s += ", and its copy " + thresholdList(copies) + " (enforceNodeAllocatable holds pods)"
	case hasMemory && !kc.EnforcePodsAllocatable:
		s += ", no allocatableMemory.available (enforceNodeAllocatable without pods)"
	}
	if len(kc.Soft) > 0 {
		grace := make([]string, len(kc.Soft))
		for i, t := range kc.Soft {
			grace[i] = fmt.Sprintf("%s %s", t.Signal, kc.SoftGracePeriod[t.Signal])
		}
		s += fmt.Sprintf("; evictionSoft %s (held for %s; evictionMaxPodGracePeriod %s)", thresholdList(kc.Soft), strings.Join(grace, ", "), kc.MaxPodGracePeriod)
	}
	return s
}

// thresholdList writes thresholds as the kubelet's flag does, "none" for none.
func thresholdList(ts []kubelet.Threshold) string {
	if len(ts) == 0 {
		return "none"
	}
	s := make([]string, len(ts))
	for i, t := range ts {
		s[i] = t.String()
	}
	return strings.Join(s, ",")
}

// checkPressure reads the kubelet's thresholds and the pressure signals once, as the agent
// would, and prints each signal against reprieve's and the kubelet's thresholds. The kubelet's
// configuration itself is checkKubeletConfig's.
func checkPressure(ctx context.Context, r *doctorReport, cfg config.Config, kr kubelet.ConfigRead, client kube.Interface) {
	if cfg.PressureSource == config.PressureSourceOff {
		r.skip("local pressure: --pressure-source off")
		return
	}
	thresholds, kc, kcErr, err := agent.PressureThresholds(cfg, kr)
	if err != nil {
		r.fail(fmt.Sprintf("pressure thresholds: %v", err), "give the thresholds in the kubelet's syntax, e.g. memory.available<500Mi,nodefs.available<15%")
		return
	}
	if kcErr != nil {
		r.skip("local pressure: off, as the kubelet's configuration could not be read (above)")
		return
	}
	assumed := ""
	if !kc.Found {
		assumed = ", assumed"
	}
	var node *v1.Node
	if cfg.PressureSource == config.PressureSourceSummary && cfg.KubeletSummaryURL == "" && client != nil {
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
		if cfg.PressureSource == config.PressureSourceSummary {
			fix = "grant get on nodes/stats, check that the kubelet's port is reachable from the pod and its certificate (--kubelet-ca-file, --kubelet-insecure-tls)"
		}
		r.fail(fmt.Sprintf("pressure signals (%s): %v", cfg.PressureSource, err), fix)
		if len(sample.Node) == 0 {
			return
		}
	}
	levels := thresholds.Levels(sample.Node)
	for _, l := range levels {
		f := func(v int64) string { return pressure.FormatAmount(l.Signal, v) }
		if l.Hard > 0 && l.Threshold <= l.Hard {
			r.fail(fmt.Sprintf("%s: reprieve's threshold %s is not above the kubelet's hard threshold %s, so the kubelet evicts first", l.Signal, f(l.Threshold), f(l.Hard)),
				"raise it in --pressure-thresholds, or leave that flag empty to derive thresholds from the kubelet's plus --pressure-headroom")
			continue
		}
		state := "ok"
		if l.Available < l.Threshold {
			state = "UNDER PRESSURE"
		}
		r.ok("%s %s of %s (reprieve's threshold %s, the kubelet's hard %s%s): %s", l.Signal, f(l.Available), f(l.Capacity), f(l.Threshold), f(l.Hard), assumed, state)
	}
}
