package volumes

import (
	"context"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
)

// TestAPIPodVolumes (issue 40, item 2): a pod's volumes, as the node lists them in
// status.volumesInUse, read from its claims and their volumes: a CSI volume gives
// kubernetes.io/csi/<driver>^<handle>; an in-tree EBS disk, as a volume or inline, the name of
// its migrated CSI driver (csi-translation-lib, as the kubelet); a generic ephemeral volume its
// own claim's volume, and never another's claim of that name; an NFS volume or an unbound claim
// attaches to no node, and so does a CSI volume whose CSIDriver says attachRequired: false
// (EFS) or an Azure file share; a missing claim, a volume bound to another claim or an in-tree iSCSI
// disk is an error that names it, with the other volumes read all the same.
func TestAPIPodVolumes(t *testing.T) {
	const ns = "db"
	pod := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "db-0", UID: "uid-db-0"}}
	claim := func(name, volume string, owner *v1.Pod) *v1.PersistentVolumeClaim {
		c := &v1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)},
			Spec: v1.PersistentVolumeClaimSpec{VolumeName: volume}}
		if owner != nil {
			c.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: owner.Name, UID: owner.UID, Controller: ptr(true)}}
		}
		return c
	}
	volume := func(name, claim string, src v1.PersistentVolumeSource) *v1.PersistentVolume {
		return &v1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: v1.PersistentVolumeSpec{PersistentVolumeSource: src,
				ClaimRef: &v1.ObjectReference{Namespace: ns, Name: claim, UID: types.UID("uid-" + claim)}}}
	}
	objs := []*v1.PersistentVolumeClaim{
		claim("data-csi", "pv-csi", nil),
		claim("data-ebs", "pv-ebs", nil),
		claim("data-nfs", "pv-nfs", nil),
		claim("data-unbound", "", nil),
		claim("db-0-scratch", "pv-eph", pod),
		claim("db-0-stolen", "pv-other", &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "other", UID: "uid-other"}}),
		claim("data-swapped", "pv-csi", nil),
	}
	pvs := []*v1.PersistentVolume{
		volume("pv-csi", "data-csi", v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "ebs.csi.aws.com", VolumeHandle: "vol-0aaa"}}),
		volume("pv-ebs", "data-ebs", v1.PersistentVolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "aws://us-east-1a/vol-0bbb"}}),
		volume("pv-nfs", "data-nfs", v1.PersistentVolumeSource{NFS: &v1.NFSVolumeSource{Server: "nfs", Path: "/"}}),
		volume("pv-eph", "db-0-scratch", v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "pd.csi.storage.gke.io", VolumeHandle: "projects/p/zones/z/disks/d"}}),
		volume("pv-other", "db-0-stolen", v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "ebs.csi.aws.com", VolumeHandle: "vol-0ddd"}}),
	}
	objs = append(objs, claim("data-efs", "pv-efs", nil))
	pvs = append(pvs, volume("pv-efs", "data-efs", v1.PersistentVolumeSource{CSI: &v1.CSIPersistentVolumeSource{Driver: "efs.csi.aws.com", VolumeHandle: "fs-1::fsap-1"}}))
	// The drivers' CSIDrivers, as their charts ship them: EBS attaches, EFS does not; the GCE PD
	// driver has none here (the kubelet then attaches).
	client := fake.NewClientset(
		&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "ebs.csi.aws.com"}, Spec: storagev1.CSIDriverSpec{AttachRequired: ptr(true)}},
		&storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: "efs.csi.aws.com"}, Spec: storagev1.CSIDriverSpec{AttachRequired: ptr(false)}})
	driverGets := 0
	client.PrependReactor("get", "csidrivers", func(k8stesting.Action) (bool, runtime.Object, error) {
		driverGets++
		return false, nil, nil
	})
	for _, c := range objs {
		if _, err := client.CoreV1().PersistentVolumeClaims(ns).Create(context.Background(), c, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pvs {
		if _, err := client.CoreV1().PersistentVolumes().Create(context.Background(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	claimVol := func(name, claim string) v1.Volume {
		return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{PersistentVolumeClaim: &v1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}}
	}
	ephemeralVol := func(name string) v1.Volume {
		return v1.Volume{Name: name, VolumeSource: v1.VolumeSource{Ephemeral: &v1.EphemeralVolumeSource{}}}
	}
	reader := NewReader(kubetest.Wrap(client))
	read := func(vols ...v1.Volume) ([]v1.UniqueVolumeName, []string, error) {
		p := pod.DeepCopy()
		p.Spec.Volumes = vols
		got, err := reader(context.Background(), p)
		return got.Attach, got.NoAttach, err
	}

	attach, noAttach, err := read(
		claimVol("data", "data-csi"),
		claimVol("legacy", "data-ebs"),
		v1.Volume{Name: "inline-ebs", VolumeSource: v1.VolumeSource{AWSElasticBlockStore: &v1.AWSElasticBlockStoreVolumeSource{VolumeID: "vol-0ccc"}}},
		ephemeralVol("scratch"),
		claimVol("shared", "data-nfs"),
		claimVol("later", "data-unbound"),
		claimVol("files", "data-efs"),
		v1.Volume{Name: "share", VolumeSource: v1.VolumeSource{AzureFile: &v1.AzureFileVolumeSource{SecretName: "s", ShareName: "sh"}}},
		v1.Volume{Name: "config", VolumeSource: v1.VolumeSource{ConfigMap: &v1.ConfigMapVolumeSource{}}},
		v1.Volume{Name: "tmp", VolumeSource: v1.VolumeSource{EmptyDir: &v1.EmptyDirVolumeSource{}}},
	)
	if err != nil {
		t.Fatalf("reading the pod's volumes: %v", err)
	}
	want := []v1.UniqueVolumeName{
		"kubernetes.io/csi/ebs.csi.aws.com^vol-0aaa",
		"kubernetes.io/csi/ebs.csi.aws.com^vol-0bbb",
		"kubernetes.io/csi/ebs.csi.aws.com^vol-0ccc",
		"kubernetes.io/csi/pd.csi.storage.gke.io^projects/p/zones/z/disks/d",
	}
	if !slices.Equal(attach, want) {
		t.Errorf("attached volumes %v, want %v", attach, want)
	}
	if wantNo := []string{"volume shared (PersistentVolume pv-nfs, nfs)", "volume later (claim data-unbound not bound)",
		"volume files (PersistentVolume pv-efs, CSI driver efs.csi.aws.com, attachRequired false)", "volume share (azureFile)"}; !slices.Equal(noAttach, wantNo) {
		t.Errorf("volumes that attach to no node %q, want %q", noAttach, wantNo)
	}
	// Each driver's CSIDriver read once, whatever the pods: ebs, efs and pd.
	if _, _, err := read(claimVol("data", "data-csi"), claimVol("files", "data-efs")); err != nil || driverGets != 3 {
		t.Errorf("CSIDriver GETs %d (%v), want 3, once per driver for the reader's life", driverGets, err)
	}

	for _, c := range []struct {
		name string
		vol  v1.Volume
		want string
	}{
		{"a missing claim", claimVol("gone", "data-gone"), `volume gone: getting PersistentVolumeClaim data-gone: persistentvolumeclaims "data-gone" not found`},
		{"another pod's claim of the ephemeral volume's name", ephemeralVol("stolen"), "volume stolen: PVC db/db-0-stolen was not created for pod db/db-0"},
		{"a volume bound to another claim", claimVol("swapped", "data-swapped"), "volume swapped: PersistentVolume pv-csi is bound to another claim (db/data-csi), not data-swapped"},
		{"an inline iSCSI disk", v1.Volume{Name: "san", VolumeSource: v1.VolumeSource{ISCSI: &v1.ISCSIVolumeSource{}}}, "volume san: an inline in-tree iscsi volume"},
	} {
		t.Run(c.name, func(t *testing.T) {
			attach, _, err := read(claimVol("data", "data-csi"), c.vol)
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "reading pod db/db-0's volumes") {
				t.Errorf("error %v; want one naming the pod and %q", err, c.want)
			}
			if !slices.Equal(attach, []v1.UniqueVolumeName{"kubernetes.io/csi/ebs.csi.aws.com^vol-0aaa"}) {
				t.Errorf("the other volume read as %v; want it read all the same", attach)
			}
		})
	}
}

// ptr is a pointer to v.
func ptr[T any](v T) *T { return &v }
