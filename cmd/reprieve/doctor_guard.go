package main

import (
	"context"
	"fmt"
	"sort"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/reprieve-dev/reprieve/agent/guard"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/nodefacts"
)

// guardUnreachable says whether err is the API server's failure to call the eviction guard
// (guard.Unreachable): the agent's own check reads it the same way.
func guardUnreachable(err error) bool { return guard.Unreachable(err) }

// guardUnreachableFix is doctor's fix for it.
const guardUnreachableFix = "check that the guard's pods are ready (kubectl get deploy -A -l app.kubernetes.io/component=eviction-guard) and serve a certificate its webhook's caBundle verifies (the guard's metric reprieve_guard_ca_bundle_published, alert ReprieveEvictionGuardDown). Meanwhile every eviction of the agent is refused: at a reclaim it deletes each pod at its last safe moment, past its PodDisruptionBudget"

// guardPodSelector selects the chart's eviction guard pods (templates/eviction-guard.yaml).
const guardPodSelector = "app.kubernetes.io/component=eviction-guard"

// guardSpotCost is what a guard replica on spot capacity costs (evictionGuard.offSpot preferred
// on a cluster whose capacity is spot, or with one node off it).
const guardSpotCost = "when the nodes its replicas run on are reclaimed together, the agents' evictions are refused until it runs elsewhere, and their pods are deleted at their last safe moment, past their PodDisruptionBudgets; a node off spot capacity (an on-demand node group, an AKS system pool) keeps it there (docs/eviction-guard.md, \"Placement\")"

// checkGuardPlacement says where the eviction guard's replicas run (issue 49, item 1): off spot
// capacity on separate hosts is ok; a replica on a spot node, two on one host, or one not
// scheduled is a warning with its cost. It reads the guard's pods by label (a few, in any
// namespace) and their nodes, once: doctor is run by hand, the agent itself never lists them.
func checkGuardPlacement(ctx context.Context, r *doctorReport, client kube.Interface) {
	if client == nil {
		return
	}
	pods, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: guardPodSelector, Limit: 50})
	if err != nil {
		r.warn("eviction guard placement: listing its pods (%s): %v", guardPodSelector, err)
		return
	}
	spotSel := make([]labels.Selector, 0, len(nodefacts.SpotPoolSelectors))
	for _, s := range nodefacts.SpotPoolSelectors {
		if sel, err := labels.Parse(s); err == nil {
			spotSel = append(spotSel, sel)
		}
	}
	var running, onSpot, pending []string
	perNode := map[string][]string{}
	for i := range pods.Items {
		p := &pods.Items[i]
		if p.DeletionTimestamp != nil || p.Status.Phase == v1.PodSucceeded || p.Status.Phase == v1.PodFailed {
			continue
		}
		name := p.Namespace + "/" + p.Name
		if p.Spec.NodeName == "" {
			pending = append(pending, name)
			continue
		}
		running = append(running, name)
		perNode[p.Spec.NodeName] = append(perNode[p.Spec.NodeName], name)
		node, err := client.CoreV1().Nodes().Get(ctx, p.Spec.NodeName, metav1.GetOptions{})
		if err != nil {
			r.warn("eviction guard placement: reading node %s of %s: %v", p.Spec.NodeName, name, err)
			continue
		}
		for _, sel := range spotSel {
			if sel.Matches(labels.Set(node.Labels)) {
				onSpot = append(onSpot, fmt.Sprintf("%s on %s (%s)", name, node.Name, sel))
				break
			}
		}
	}
	if len(running) == 0 && len(pending) == 0 {
		r.skip("eviction guard placement: no guard pod (%s) in the cluster: evictionGuard.enabled=false, or not installed", guardPodSelector)
		return
	}
	ok := true
	if len(pending) > 0 {
		ok = false
		r.warn("eviction guard: %s not scheduled; with evictionGuard.offSpot required on a cluster of spot nodes only it never is (set it to preferred): while no replica answers, %s",
			strings.Join(pending, ", "), "every eviction of the agents is refused")
	}
	if len(onSpot) > 0 {
		ok = false
		r.warn("eviction guard: %s on spot capacity (evictionGuard.offSpot preferred, no other node to run on): %s", strings.Join(onSpot, ", "), guardSpotCost)
	}
	var shared []string
	for n, ps := range perNode {
		if len(ps) > 1 {
			shared = append(shared, fmt.Sprintf("%s on %s", strings.Join(ps, " and "), n))
		}
	}
	sort.Strings(shared)
	if len(shared) > 0 {
		ok = false
		r.warn("eviction guard: %s: one host's loss takes every replica there (a cluster with one node the guard may use)", strings.Join(shared, "; "))
	}
	if ok {
		r.ok("eviction guard: %d replica(s) off spot capacity, on separate hosts", len(running))
	}
}
