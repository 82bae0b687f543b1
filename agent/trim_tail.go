package agent

import (
	v1 "k8s.io/api/core/v1"
)

// keepTail keeps in the trimmed pod out what plan.Tail reads of p: whether a regular container
// has a preStop hook (an empty handler marks it) and each native sidecar (a restartable init
// container, its name and restart policy alone), so that the plan leaves room for the time the
// kubelet may take past the grace (issue 38, case 2).
func keepTail(p, out *v1.Pod) {
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
			// container already, sidecars' included.
			out.Spec.InitContainers = append(out.Spec.InitContainers, v1.Container{Name: "sidecar", RestartPolicy: &always})
		}
	}
}
