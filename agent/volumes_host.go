package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// The kubelet's record of each CSI volume it mounted for a pod (k8s.io/kubernetes v1.37,
// pkg/volume/csi): csiMountMgr.SetUpAt saves, with saveVolumeData,
// <root-dir>/pods/<podUID>/volumes/kubernetes.io~csi/<spec volume name>/vol_data.json, a JSON
// object of strings whose keys are volDataKey's (csi_mounter.go): "specVolID", "volumeHandle",
// "driverName", "nodeName", "attachmentID", "volumeLifecycleMode" and "seLinuxMountContext".
// The plugin directory is the plugin name "kubernetes.io/csi" escaped by EscapeQualifiedName
// ("/" becomes "~"). The directory goes when the kubelet tears the volume down.
const (
	csiPluginName      = "kubernetes.io/csi"
	csiPluginDir       = "kubernetes.io~csi"
	csiVolDataFile     = "vol_data.json"
	csiVolNameSep      = "^"
	csiLifecycleInline = "Ephemeral"
)

// csiVolData is the part of vol_data.json that names the volume.
type csiVolData struct {
	DriverName          string `json:"driverName"`
	VolumeHandle        string `json:"volumeHandle"`
	VolumeLifecycleMode string `json:"volumeLifecycleMode"`
}

// hostPodVolumes reads, from the host's filesystem and without any API read, which volumes of
// the node's status.volumesInUse belong to a pod (issue 40, item 2): the unique name the
// kubelet lists there for a CSI volume is GetUniqueVolumeName(plugin, GetVolumeName(spec)) =
// "kubernetes.io/csi/<driverName>^<volumeHandle>" (pkg/volume/util/util.go and
// csiPlugin.GetVolumeName in pkg/volume/csi/csi_plugin.go, v1.37). Only the CSI form is read:
// the in-tree cloud disks (EBS, GCE PD, Azure Disk, Cinder, vSphere, Portworx) are migrated to
// their CSI drivers on every current platform, and v1.37's pkg/volume no longer has their
// in-tree plugins: the kubelet mounts them through the CSI plugin, under this directory and
// with this unique name. FC and iSCSI, still in-tree, are not read (their pods are unknown). A
// block-mode volume (volumeDevices) keeps its record elsewhere (plugins/kubernetes.io/csi/
// volumeDevices), not per pod: it is not found here, and a pod with only such volumes is
// reported as unknown by its caller, never as nothing.
type hostPodVolumes struct {
	// pods is <host-root>/<kubelet-root-dir>/pods.
	pods string
}

// newHostPodVolumes reads the pods' volumes under cfg's --host-root and --kubelet-root-dir; it
// returns a reader that always fails, with why, when the kubelet's directory is not mounted for
// the agent: the chart mounts it (read-only) only with --pressure-source=host.
func newHostPodVolumes(cfg Config) func(types.UID) ([]v1.UniqueVolumeName, error) {
	if cfg.HostRoot == "" || cfg.PressureSource != PressureSourceHost {
		err := fmt.Errorf("the kubelet's root directory is not read (--pressure-source=%s, --host-root=%q): the chart mounts it only with --pressure-source=host", cfg.PressureSource, cfg.HostRoot)
		return func(types.UID) ([]v1.UniqueVolumeName, error) { return nil, err }
	}
	return hostPodVolumes{pods: filepath.Join(cfg.HostRoot, cfg.KubeletRootDir, "pods")}.read
}

// ReadPodVolumes is what the agent reads of pod uid's volumes under the kubelet's root
// directory kubeletRoot (as the host sees it, or under --host-root): the unique names the node
// lists in status.volumesInUse. For tests on a real node, which read as root.
func ReadPodVolumes(kubeletRoot string, uid types.UID) ([]v1.UniqueVolumeName, error) {
	return hostPodVolumes{pods: filepath.Join(kubeletRoot, "pods")}.read(uid)
}

// read returns the unique names of pod uid's attachable CSI volumes, sorted, from their
// vol_data.json; inline (ephemeral) CSI volumes are never attached nor listed in volumesInUse,
// and are left out. A volume whose record cannot be read is reported in the error, with the
// others' names: the error says which. No CSI volume at all is no name and no error.
func (h hostPodVolumes) read(uid types.UID) ([]v1.UniqueVolumeName, error) {
	podDir := filepath.Join(h.pods, string(uid))
	if _, err := os.Stat(podDir); err != nil {
		if errors.Is(err, fs.ErrPermission) {
			// The kubelet makes its root directory, pods/ and every pod's directory 0750,
			// owner and group root (setupDataDirs in pkg/kubelet/kubelet.go); the chart runs
			// the agent as a non-root user with no capabilities, which cannot search them.
			return nil, fmt.Errorf("reading pod %s's volumes: the agent's user (uid %d) cannot search the kubelet's directory, which the kubelet makes 0750 root:root: %w", uid, os.Getuid(), err)
		}
		if _, perr := os.Stat(h.pods); perr != nil {
			return nil, fmt.Errorf("reading pod %s's volumes: the kubelet's pods directory: %w", uid, perr)
		}
		return nil, fmt.Errorf("reading pod %s's volumes: its directory (not set up on this node yet, or torn down): %w", uid, err)
	}
	dir := filepath.Join(podDir, "volumes", csiPluginDir)
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading pod %s's CSI volumes: %w", uid, err)
	}
	var names []v1.UniqueVolumeName
	var errs []error
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		file := filepath.Join(dir, e.Name(), csiVolDataFile)
		b, err := os.ReadFile(file)
		if err != nil {
			errs = append(errs, fmt.Errorf("reading the kubelet's record of volume %s: %w", e.Name(), err))
			continue
		}
		var d csiVolData
		if err := json.Unmarshal(b, &d); err != nil {
			errs = append(errs, fmt.Errorf("parsing %s: %w", file, err))
			continue
		}
		if d.VolumeLifecycleMode == csiLifecycleInline {
			continue
		}
		if d.DriverName == "" || d.VolumeHandle == "" {
			errs = append(errs, fmt.Errorf("%s names no driverName or volumeHandle", file))
			continue
		}
		names = append(names, v1.UniqueVolumeName(csiPluginName+"/"+d.DriverName+csiVolNameSep+d.VolumeHandle))
	}
	slices.Sort(names)
	if len(errs) > 0 {
		return names, fmt.Errorf("reading pod %s's CSI volumes: %w", uid, errors.Join(errs...))
	}
	return names, nil
}
