package informer

import (
	v1 "k8s.io/api/core/v1"

	"github.com/reprieve-dev/reprieve/agent/plan"
)

// keepTail keeps in the trimmed pod out what plan.Tail reads of p: whether a regular container
// has a preStop hook (an empty handler marks it) and each native sidecar (a restartable init
// container: its restart policy, and whether it has a preStop hook of its own), so that the plan
// leaves room for the time the kubelet may take past the grace (issue 38, case 2; issue 50, case
// 3). It also keeps what makes a pod a CSI node plugin (keepVolumePlugin).
func keepTail(p, out *v1.Pod) {
	keepVolumePlugin(p, out)
	for _, c := range p.Spec.Containers {
		if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
			if len(out.Spec.Containers) == 0 {
				out.Spec.Containers = []v1.Container{{Name: "requests"}}
			}
			out.Spec.Containers[0].Lifecycle = &v1.Lifecycle{PreStop: &v1.LifecycleHandler{}}
			break
		}
	}
	for _, c := range p.Spec.InitContainers {
		if c.RestartPolicy != nil && *c.RestartPolicy == v1.ContainerRestartPolicyAlways {
			always := v1.ContainerRestartPolicyAlways
			// No resources: the requests the pressure loop ranks by are in the requests
			// container already, sidecars' included. A sidecar's own preStop hook lengthens
			// the tail (plan.SidecarHookTail): an empty handler marks it.
			sc := v1.Container{Name: "sidecar", RestartPolicy: &always}
			if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
				sc.Lifecycle = &v1.Lifecycle{PreStop: &v1.LifecycleHandler{}}
			}
			out.Spec.InitContainers = append(out.Spec.InitContainers, sc)
		}
	}
}

// keepVolumePlugin keeps in the trimmed pod out what plan.IsVolumePlugin reads of p: the path
// of its hostPath volume of the kubelet's plugin registration directory (the trim keeps each
// volume's kind alone), so that a CSI node plugin is never evicted (issue 40, item 3).
func keepVolumePlugin(p, out *v1.Pod) {
	for _, v := range p.Spec.Volumes {
		if !plan.IsRegistrationDir(v) {
			continue
		}
		for j := range out.Spec.Volumes {
			if out.Spec.Volumes[j].Name == v.Name && out.Spec.Volumes[j].HostPath != nil {
				out.Spec.Volumes[j].HostPath.Path = "/var/lib/kubelet/plugins_registry"
			}
		}
	}
}
