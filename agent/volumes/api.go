package volumes

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/component-helpers/storage/ephemeral"
	csitrans "k8s.io/csi-translation-lib"
	"k8s.io/klog/v2"

	"github.com/reprieve-dev/reprieve/agent/evict"
	"github.com/reprieve-dev/reprieve/agent/kube"
)

// The unique name the kubelet gives a CSI volume in the node's status.volumesInUse:
// GetUniqueVolumeName(plugin, GetVolumeName(spec)) = "kubernetes.io/csi/<driver>^<volumeHandle>"
// (pkg/volume/util/util.go and csiPlugin.GetVolumeName in pkg/volume/csi/csi_plugin.go, v1.37).
const (
	csiPluginName = "kubernetes.io/csi"
	csiVolNameSep = "^"
)

// podVolumeReadTimeout bounds one pod's reads (a claim and a volume per claim): the summary
// says "unknown" with the error rather than wait on a congested API server.
const podVolumeReadTimeout = 10 * time.Second

// apiPodVolumes reads from the API server which of the node's volumesInUse belong to a pod
// (issue 40, item 2), as the kubelet's desired state of world names them
// (pkg/kubelet/volumemanager/populator, v1.37): for each of the pod's claims, and for the claim
// of each generic ephemeral volume (named <pod>-<volume>, ephemeral.VolumeClaimName), one GET of
// the PersistentVolumeClaim and one of its bound PersistentVolume. A CSI volume is named by its
// driver and handle. An in-tree cloud disk (EBS, GCE PD, Azure Disk, Cinder, vSphere, Portworx),
// as a PersistentVolume or inline in the pod, is migrated to its CSI driver on every current
// platform: the kubelet translates it with k8s.io/csi-translation-lib, and so does this, to
// the same name. A CSI volume whose driver's CSIDriver says attachRequired: false (EFS, Azure
// File, Filestore, NFS) attaches to no node and is never in volumesInUse: the kubelet's CSI
// plugin skips the attach then, and only then (a driver without a CSIDriver object attaches),
// so the CSIDriver is read too, once per driver for the agent's life (its attachRequired is
// immutable). The agent reads only during a window with a deadline, only pods planned with a
// volume that needs attaching, once each per window (evict.Executor.notePodVolumes), at most
// readQPS GETs a second (a fifth of the client's 50, which the evictions share): no list and no
// watch (the chart's ClusterRole grants get alone).
type apiPodVolumes struct {
	client kube.Interface
	tr     csitrans.CSITranslator
	// limit paces the GETs; attaches caches each driver's attachRequired.
	limit    flowcontrol.RateLimiter
	attaches sync.Map // driver name -> bool
}

// readQPS and readBurst pace the reads of the pods' claims, volumes and drivers: at a notice
// every pod with a claim is read at once, and the evictions must keep the client's budget.
const (
	readQPS   = 10
	readBurst = 20
)

func newReader(client kube.Interface) *apiPodVolumes {
	return &apiPodVolumes{client: client, tr: csitrans.New(), limit: flowcontrol.NewTokenBucketRateLimiter(readQPS, readBurst)}
}

// ReadPod is what the agent reads of pod's volumes through client: the unique names the
// node lists in status.volumesInUse of the volumes that attach, and the claimed ones that attach
// to no node. For tests that check the names against a real node's.
func ReadPod(ctx context.Context, client kube.Interface, pod *v1.Pod) (evict.VolumesOf, error) {
	return newReader(client).read(ctx, pod)
}

// NewReader is the executor's reader of the pods' volumes: one for the agent's life, so
// that its pace and its drivers' cache hold across windows.
func NewReader(client kube.Interface) func(context.Context, *v1.Pod) (evict.VolumesOf, error) {
	return newReader(client).read
}

// wait takes one GET's turn of the reads' pace, or fails when ctx ends first.
func (a *apiPodVolumes) wait(ctx context.Context) error {
	if err := a.limit.Wait(ctx); err != nil {
		return fmt.Errorf("waiting for the reads' pace (%d a second): %w", readQPS, err)
	}
	return nil
}

// driverAttaches says whether the kubelet attaches driver's volumes: false only when its
// CSIDriver says attachRequired: false; true without a CSIDriver (csiPlugin.skipAttach in
// pkg/volume/csi/csi_attacher.go, v1.37, treats a missing one as attach required).
func (a *apiPodVolumes) driverAttaches(ctx context.Context, driver string) (bool, error) {
	if v, ok := a.attaches.Load(driver); ok {
		return v.(bool), nil
	}
	if err := a.wait(ctx); err != nil {
		return true, err
	}
	d, err := a.client.StorageV1().CSIDrivers().Get(ctx, driver, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		a.attaches.Store(driver, true)
		return true, nil
	case err != nil:
		return true, fmt.Errorf("getting CSIDriver %s: %w", driver, err)
	}
	attaches := d.Spec.AttachRequired == nil || *d.Spec.AttachRequired
	a.attaches.Store(driver, attaches)
	return attaches, nil
}

// read returns pod's volumes, each as the kubelet names it in volumesInUse (sorted) or, for one
// that attaches to no node, described; volumes of other kinds (configMap, emptyDir, ...) are
// not named. A volume that cannot be read (its claim or volume missing, not bound, a kind whose
// name is not computed) is in the error, which says which, with the others read all the same.
func (a *apiPodVolumes) read(ctx context.Context, pod *v1.Pod) (evict.VolumesOf, error) {
	ctx, cancel := context.WithTimeout(ctx, podVolumeReadTimeout)
	defer cancel()
	logger := klog.FromContext(ctx)
	var out evict.VolumesOf
	var errs []error
	for i := range pod.Spec.Volumes {
		v := &pod.Spec.Volumes[i]
		var pv *v1.PersistentVolume
		var claim string
		switch {
		case v.PersistentVolumeClaim != nil:
			claim = v.PersistentVolumeClaim.ClaimName
		case v.Ephemeral != nil:
			claim = ephemeral.VolumeClaimName(pod, v)
		case v.AzureFile != nil:
			// A file share, mounted over the network: migrated to file.csi.azure.com, whose
			// CSIDriver says attachRequired: false.
			out.NoAttach = append(out.NoAttach, fmt.Sprintf("volume %s (azureFile)", v.Name))
			continue
		case a.tr.IsInlineMigratable(v):
			t, err := a.tr.TranslateInTreeInlineVolumeToCSI(logger, v, pod.Namespace)
			if err != nil {
				errs = append(errs, fmt.Errorf("volume %s: translating the inline in-tree volume to its CSI driver's: %w", v.Name, err))
				continue
			}
			pv = t
		case v.ISCSI != nil || v.FC != nil || v.RBD != nil:
			errs = append(errs, fmt.Errorf("volume %s: an inline in-tree %s volume, whose name in volumesInUse is not computed", v.Name, sourceKind(v.VolumeSource)))
			continue
		default:
			continue
		}
		if pv == nil {
			got, desc, err := a.claimed(ctx, pod, v, claim)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if got == nil {
				out.NoAttach = append(out.NoAttach, desc)
				continue
			}
			pv = got
		}
		name, desc, err := a.uniqueName(ctx, v.Name, pv)
		switch {
		case err != nil:
			errs = append(errs, err)
		case name == "":
			out.NoAttach = append(out.NoAttach, desc)
		default:
			out.Attach = append(out.Attach, name)
		}
	}
	slices.Sort(out.Attach)
	out.Attach = slices.Compact(out.Attach)
	if len(errs) > 0 {
		return out, fmt.Errorf("reading pod %s/%s's volumes: %w", pod.Namespace, pod.Name, errors.Join(errs...))
	}
	return out, nil
}

// claimed reads the volume bound to pod's claim (of pod volume v): the claim, checked to be
// the pod's own when it is an ephemeral volume's, and its PersistentVolume. A claim with no
// volume yet (never bound) has nothing attached: no volume and a description.
func (a *apiPodVolumes) claimed(ctx context.Context, pod *v1.Pod, v *v1.Volume, claim string) (*v1.PersistentVolume, string, error) {
	if err := a.wait(ctx); err != nil {
		return nil, "", fmt.Errorf("volume %s: %w", v.Name, err)
	}
	pvc, err := a.client.CoreV1().PersistentVolumeClaims(pod.Namespace).Get(ctx, claim, metav1.GetOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("volume %s: getting PersistentVolumeClaim %s: %w", v.Name, claim, err)
	}
	if v.Ephemeral != nil {
		if err := ephemeral.VolumeIsForPod(pod, pvc); err != nil {
			return nil, "", fmt.Errorf("volume %s: %w", v.Name, err)
		}
	}
	if pvc.Spec.VolumeName == "" {
		// The kubelet does not start a pod whose claim is unbound: nothing was mounted.
		return nil, fmt.Sprintf("volume %s (claim %s not bound)", v.Name, claim), nil
	}
	if err := a.wait(ctx); err != nil {
		return nil, "", fmt.Errorf("volume %s: %w", v.Name, err)
	}
	pv, err := a.client.CoreV1().PersistentVolumes().Get(ctx, pvc.Spec.VolumeName, metav1.GetOptions{})
	if err != nil {
		return nil, "", fmt.Errorf("volume %s: getting PersistentVolume %s of claim %s: %w", v.Name, pvc.Spec.VolumeName, claim, err)
	}
	if ref := pv.Spec.ClaimRef; ref != nil && ref.UID != "" && ref.UID != pvc.UID {
		return nil, "", fmt.Errorf("volume %s: PersistentVolume %s is bound to another claim (%s/%s), not %s", v.Name, pv.Name, ref.Namespace, ref.Name, claim)
	}
	return pv, "", nil
}

// uniqueName is pv's name in volumesInUse, translated to its CSI driver's first when it is an
// in-tree cloud disk; for a kind that attaches to no node (NFS, a local or host path volume,
// CephFS) no name and a description; an in-tree kind that attaches but is not migrated (iSCSI,
// FC, RBD, a FlexVolume) is an error.
func (a *apiPodVolumes) uniqueName(ctx context.Context, volume string, pv *v1.PersistentVolume) (v1.UniqueVolumeName, string, error) {
	if pv.Spec.AzureFile != nil {
		return "", fmt.Sprintf("volume %s (PersistentVolume %s, azureFile)", volume, pv.Name), nil
	}
	if pv.Spec.CSI == nil && a.tr.IsPVMigratable(pv) {
		t, err := a.tr.TranslateInTreePVToCSI(klog.FromContext(ctx), pv)
		if err != nil {
			return "", "", fmt.Errorf("volume %s: translating PersistentVolume %s to its CSI driver's: %w", volume, pv.Name, err)
		}
		pv = t
	}
	s := pv.Spec.PersistentVolumeSource
	switch {
	case s.CSI != nil:
		if s.CSI.Driver == "" || s.CSI.VolumeHandle == "" {
			return "", "", fmt.Errorf("volume %s: PersistentVolume %s names no CSI driver or volume handle", volume, pv.Name)
		}
		attaches, err := a.driverAttaches(ctx, s.CSI.Driver)
		if err != nil {
			// Named all the same: the summary then says whether the node listed it.
			klog.FromContext(ctx).V(2).Info("Could not tell whether a CSI driver attaches; assuming it does", "driver", s.CSI.Driver, "err", err)
		}
		if !attaches {
			return "", fmt.Sprintf("volume %s (PersistentVolume %s, CSI driver %s, attachRequired false)", volume, pv.Name, s.CSI.Driver), nil
		}
		return v1.UniqueVolumeName(csiPluginName + "/" + s.CSI.Driver + csiVolNameSep + s.CSI.VolumeHandle), "", nil
	case s.NFS != nil || s.Local != nil || s.HostPath != nil || s.CephFS != nil || s.Glusterfs != nil:
		return "", fmt.Sprintf("volume %s (PersistentVolume %s, %s)", volume, pv.Name, sourceKind(s)), nil
	}
	return "", "", fmt.Errorf("volume %s: PersistentVolume %s is an in-tree %s volume, whose name in volumesInUse is not computed", volume, pv.Name, sourceKind(s))
}

// sourceKind names the kind of a volume source (a v1.VolumeSource or v1.PersistentVolumeSource)
// as the API spells it: the JSON name of its one field that is set ("nfs", "iscsi", "flexVolume").
func sourceKind(src any) string {
	v := reflect.ValueOf(src)
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
			return name
		}
	}
	return "unknown-kind"
}
