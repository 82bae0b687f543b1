package main

import (
	"context"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/plan"
)

// checkVolumePlugins warns about the node's CSI node plugins that do not tolerate the
// interruption taint forever (issue 40, item 3): with a NoExecute taint the taint-eviction
// controller deletes them at the notice, and the volumes of the pods that leave after them are
// never unmounted, so their replacements wait six minutes for the detach. reprieve itself never
// evicts them (plan.SkipVolumePlugin). `reprieve audit` says the same for a whole pool.
func checkVolumePlugins(ctx context.Context, r *doctorReport, cfg config.Config, client kube.Interface) {
	if client == nil {
		return
	}
	taint, err := config.ParseTaint(cfg.InterruptionTaint)
	if err != nil || plan.Eviction(cfg.InterruptionEviction) == plan.EvictionReprieve {
		// With --interruption-eviction=reprieve the taint goes on NoSchedule, which deletes
		// nothing, and reprieve never evicts a plugin.
		return
	}
	// The node's pods in pages of 100: a tenant's pods can be large, and doctor keeps only the
	// plugins.
	var plugins []v1.Pod
	opts := metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", cfg.NodeName).String(), Limit: 100}
	for {
		list, err := client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, opts)
		if err != nil {
			r.skip("CSI node plugins: the pods of node %s could not be read: %v", cfg.NodeName, err)
			return
		}
		for i := range list.Items {
			if plan.IsVolumePlugin(&list.Items[i]) {
				plugins = append(plugins, list.Items[i])
			}
		}
		if opts.Continue = list.Continue; opts.Continue == "" {
			break
		}
	}
	for _, p := range plugins {
		if !plan.ToleratesForever(p.Spec.Tolerations, taint, cfg.TolerationComparisonOperators) {
			r.warn("CSI node plugin %s/%s does not tolerate %s forever: kube-controller-manager deletes it at a notice, and the volumes of the pods that leave after it stay mounted until the machine goes (their replacements wait six minutes to attach). Add the toleration `- operator: Exists` to its DaemonSet (docs/workloads.md, \"Volumes and the CSI node plugins\")",
				p.Namespace, p.Name, cfg.InterruptionTaint)
		}
	}
	if len(plugins) > 0 {
		r.ok("CSI node plugins on node %s: %d seen; reprieve never evicts them", cfg.NodeName, len(plugins))
	}
}
