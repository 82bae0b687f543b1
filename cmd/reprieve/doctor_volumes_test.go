package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"

	authorizationv1 "k8s.io/api/authorization/v1"
	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/reprieve-dev/reprieve/agent/config"
	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
)

// csiNodePlugin is a CSI node plugin pod as the drivers' DaemonSets run it: it mounts the
// kubelet's plugin registration directory (node-driver-registrar's socket) from the host.
func csiNodePlugin(name string, tolerations ...v1.Toleration) *v1.Pod {
	return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: name},
		Spec: v1.PodSpec{NodeName: "n1", Tolerations: tolerations, Volumes: []v1.Volume{{Name: "registration-dir",
			VolumeSource: v1.VolumeSource{HostPath: &v1.HostPathVolumeSource{Path: "/var/lib/kubelet/plugins_registry/"}}}}}}
}

// TestDoctorVolumePlugins (issue 40, item 3): doctor warns about a CSI node plugin of its node
// that does not tolerate the NoExecute interruption taint forever (kube-controller-manager
// would delete it at the notice, before the volumes it unstages are released), not about one
// that tolerates everything (the EBS, GCE PD and Azure Disk charts' default), and about none
// with --interruption-eviction=reprieve, whose NoSchedule taint deletes nothing.
func TestDoctorVolumePlugins(t *testing.T) {
	host := filepath.Join("..", "..", "kubelet", "testdata", "cgroupv2")
	c := fake.NewClientset(
		&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}},
		csiNodePlugin("ebs-csi-node-x", v1.Toleration{Operator: v1.TolerationOpExists}),
		csiNodePlugin("csi-hostpathplugin-0"),
		csiNodePlugin("bounded-node-x", v1.Toleration{Operator: v1.TolerationOpExists, Effect: v1.TaintEffectNoExecute, TolerationSeconds: new(int64(300))}),
		&v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web"}, Spec: v1.PodSpec{NodeName: "n1"}},
	)
	c.PrependReactor("create", "selfsubjectaccessreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		r := a.(k8stesting.CreateAction).GetObject().(*authorizationv1.SelfSubjectAccessReview)
		r.Status.Allowed = true
		return true, r, nil
	})
	client := func(config.Config) (kube.Interface, error) { return kubetest.Wrap(c), nil }
	// The NoExecute mode, explicitly (the default is --interruption-eviction=reprieve).
	args := []string{"--node=n1", "--provider=none", "--host-root=" + host, "--kubelet-root-dir=/", "--imagefs-dir=/", "--interruption-eviction=kube-controller-manager"}
	var out, errOut bytes.Buffer
	if code := runDoctor(context.Background(), args, &out, &errOut, client); code != 0 {
		t.Errorf("exit %d, want 0: a plugin that would be deleted is a warning\n%s%s", code, out.String(), errOut.String())
	}
	for _, want := range []string{"WARN  CSI node plugin kube-system/csi-hostpathplugin-0 does not tolerate cloud=spot:NoExecute forever",
		"WARN  CSI node plugin kube-system/bounded-node-x does not tolerate", "ok    CSI node plugins on node n1: 3 seen"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "ebs-csi-node-x does not") || strings.Contains(out.String(), "CSI node plugin app/web") {
		t.Errorf("a plugin that tolerates everything, or a pod that is no plugin, is warned about:\n%s", out.String())
	}
	// With --interruption-eviction=reprieve the taint is NoSchedule: nothing deletes them.
	out.Reset()
	if code := runDoctor(context.Background(), append(args, "--interruption-eviction=reprieve"), &out, &errOut, client); code != 0 ||
		strings.Contains(out.String(), "WARN  CSI node plugin") {
		t.Errorf("exit %d with --interruption-eviction=reprieve; want 0 and no plugin warned about:\n%s%s", code, out.String(), errOut.String())
	}
}
