package agent

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// writeVolData writes one vol_data.json as the kubelet does (saveVolumeData in
// k8s.io/kubernetes v1.37 pkg/volume/csi/csi_util.go: a JSON object of strings, keys from
// volDataKey in csi_mounter.go) under <kubelet root>/pods/<uid>/volumes/kubernetes.io~csi/<vol>.
func writeVolData(t *testing.T, kubeletRoot, uid, vol, content string) {
	t.Helper()
	dir := filepath.Join(kubeletRoot, "pods", uid, "volumes", "kubernetes.io~csi", vol)
	if err := os.MkdirAll(filepath.Join(dir, "mount"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "vol_data.json"), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestHostPodVolumes (issue 40, item 2): a pod's volumes, as the node lists them in
// status.volumesInUse, read from the kubelet's records under the host root: an attachable CSI
// volume gives kubernetes.io/csi/<driver>^<handle>, an inline one nothing; a pod without CSI
// volumes has none and no error; a missing pod directory, a missing kubelet directory, bad JSON
// or a record without a handle are errors that say so, never a panic, and never silently
// nothing.
func TestHostPodVolumes(t *testing.T) {
	root := t.TempDir()
	kubelet := filepath.Join(root, "var/lib/kubelet")
	// The shape of a real record (the real node's, test/realnode, csi-test's mock driver).
	writeVolData(t, kubelet, "uid-db", "pvc-1234", `{"attachmentID":"csi-5f7e","driverName":"hostpath.csi.k8s.io","nodeName":"node-1","specVolID":"pvc-1234","volumeHandle":"vol-abc","volumeLifecycleMode":"Persistent"}`+"\n")
	writeVolData(t, kubelet, "uid-db", "pvc-5678", `{"driverName":"ebs.csi.aws.com","specVolID":"pvc-5678","volumeHandle":"vol-0a1b"}`)
	writeVolData(t, kubelet, "uid-db", "inline", `{"driverName":"secrets-store.csi.k8s.io","specVolID":"inline","volumeHandle":"csi-123","volumeLifecycleMode":"Ephemeral"}`)
	writeVolData(t, kubelet, "uid-bad", "pvc-1", `{"driverName":`)
	writeVolData(t, kubelet, "uid-bad", "pvc-2", `{"driverName":"ebs.csi.aws.com","specVolID":"pvc-2","volumeHandle":"vol-2"}`)
	writeVolData(t, kubelet, "uid-nohandle", "pvc-3", `{"driverName":"ebs.csi.aws.com"}`)
	if err := os.MkdirAll(filepath.Join(kubelet, "pods", "uid-empty", "volumes", "kubernetes.io~empty-dir", "cache"), 0o755); err != nil {
		t.Fatal(err)
	}

	cfg := DefaultConfig()
	cfg.HostRoot, cfg.PressureSource = root, PressureSourceHost
	read := newHostPodVolumes(cfg)
	for _, c := range []struct {
		uid     string
		want    []v1.UniqueVolumeName
		wantErr string
	}{
		{uid: "uid-db", want: []v1.UniqueVolumeName{"kubernetes.io/csi/ebs.csi.aws.com^vol-0a1b", "kubernetes.io/csi/hostpath.csi.k8s.io^vol-abc"}},
		{uid: "uid-empty"},
		{uid: "uid-bad", want: []v1.UniqueVolumeName{"kubernetes.io/csi/ebs.csi.aws.com^vol-2"}, wantErr: "pvc-1/vol_data.json"},
		{uid: "uid-nohandle", wantErr: "names no driverName or volumeHandle"},
		{uid: "uid-gone", wantErr: "torn down"},
	} {
		got, err := read(types.UID(c.uid))
		if !slices.Equal(got, c.want) {
			t.Errorf("pod %s: volumes %v, want %v", c.uid, got, c.want)
		}
		if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
			t.Errorf("pod %s: error %v, want one containing %q", c.uid, err, c.wantErr)
		}
	}

	// No kubelet directory under the host root: an error naming it.
	cfg.HostRoot = t.TempDir()
	if _, err := newHostPodVolumes(cfg)(types.UID("uid-db")); err == nil || !strings.Contains(err.Error(), "the kubelet's pods directory") {
		t.Errorf("no kubelet directory: error %v, want one naming the kubelet's pods directory", err)
	}
	// Not mounted for the agent (another pressure source): always an error that says why.
	cfg.HostRoot, cfg.PressureSource = root, PressureSourceSummary
	if _, err := newHostPodVolumes(cfg)(types.UID("uid-db")); err == nil || !strings.Contains(err.Error(), "--pressure-source=host") {
		t.Errorf("pressure source summary: error %v, want one saying the directory is read only with --pressure-source=host", err)
	}
}
