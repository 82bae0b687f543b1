package testenv

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// kwokNodeLeaseSeconds is the node lease duration kwok keeps renewing, as a kubelet does
// by default. Without leases the heartbeat-with-lease stage refreshes node status only
// every 10 minutes and the node-lifecycle controller would mark nodes unreachable.
const kwokNodeLeaseSeconds = 40

// kwokNodeStages are the stage files, relative to ToolsBin()/kwok-stages, that make kwok's
// nodes Ready at once and keep their lease.
var kwokNodeStages = []string{
	"node/fast/node-initialize.yaml",
	"node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
}

// kwokGeneralPodStages are kwok's "general" pod stages minus its pod-delete: pods go
// Pending, then Running and Ready, each step after 1 s plus up to 5 s of jitter (per-pod
// annotations such as pod-ready.stage.kwok.x-k8s.io/delay override that).
var kwokGeneralPodStages = []string{
	"pod/general/pod-create.yaml",
	"pod/general/pod-init-container-running.yaml",
	"pod/general/pod-init-container-completed.yaml",
	"pod/general/pod-ready.yaml",
	"pod/general/pod-complete.yaml",
}

// kwokFastPodStages are kwok's "fast" pod stages minus its pod-delete: pods turn Running
// and Ready as soon as kwok sees them.
var kwokFastPodStages = []string{
	"pod/fast/pod-ready.yaml",
	"pod/fast/pod-complete.yaml",
}

// kwokStockStages lists every stock stage file the package may use.
var kwokStockStages = slices.Concat(kwokNodeStages, kwokGeneralPodStages, kwokFastPodStages)

// PodDeleteStage replaces kwok's stock pod-delete stage. The stock one waits a random time
// between 1 s and the deletion timestamp, so a pod deleted with a long grace period may
// vanish early and a deadline test pass by luck. This one has no jitter: it deletes the pod
// at .metadata.deletionTimestamp, as a pod whose containers use their whole grace period
// would. The API server stores that timestamp in whole seconds (delete time + grace, rounded
// down), so a pod deleted with grace G vanishes between G-1 and G seconds after the delete:
// tests that must not depend on that second check the request time plus the grace given as
// well. The delay is an absolute time, so updates to the terminating pod (which make kwok
// re-plan the stage) do not restart it, while a second delete that shortens the grace period
// moves it earlier. Like the stock stage it leaves pods that still carry finalizers alone.
const PodDeleteStage = `apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-delete
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'Exists'
    - key: '.metadata.finalizers'
      operator: 'DoesNotExist'
  weight: 1
  weightFrom:
    expressionFrom: '.metadata.annotations["pod-delete.stage.kwok.x-k8s.io/weight"]'
  delay:
    durationFrom:
      expressionFrom: '.metadata.deletionTimestamp'
  next:
    delete: true
`

// writeKwokStages concatenates the stock stages and PodDeleteStage into one multi-document
// YAML file and returns its path.
func (e *Env) writeKwokStages(fastPods bool) (string, error) {
	files := slices.Concat(kwokNodeStages, kwokGeneralPodStages)
	if fastPods {
		files = slices.Concat(kwokNodeStages, kwokFastPodStages)
	}
	var buf bytes.Buffer
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(e.toolsBin, KwokStagesDir, f))
		if err != nil {
			return "", fmt.Errorf("reading kwok stage: %w", err)
		}
		buf.WriteString("---\n")
		buf.Write(bytes.TrimRight(data, "\n"))
		buf.WriteString("\n")
	}
	buf.WriteString("---\n")
	buf.WriteString(PodDeleteStage)
	path := filepath.Join(e.dataDir, "kwok-stages.yaml")
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		return "", fmt.Errorf("writing kwok stages: %w", err)
	}
	return path, nil
}

func (e *Env) startKwok(ctx context.Context, fastPods bool, kubeconfig string) error {
	stages, err := e.writeKwokStages(fastPods)
	if err != nil {
		return err
	}
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	server := "127.0.0.1:" + strconv.Itoa(ports[0])
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--config=" + stages,
		"--manage-nodes-with-annotation-selector=" + KwokNodeAnnotationKey + "=" + KwokNodeAnnotationValue,
		"--node-lease-duration-seconds=" + strconv.Itoa(kwokNodeLeaseSeconds),
		"--server-address=" + server,
		"--cidr=10.244.0.0/16",
		"--node-ip=127.0.0.1",
	}
	begin := time.Now()
	p, err := StartProcess(ctx, "kwok", filepath.Join(e.LogDir, "kwok.log"), filepath.Join(e.toolsBin, KwokBin), args, nil)
	if err != nil {
		return err
	}
	e.mu.Lock()
	e.kwok = p
	e.mu.Unlock()
	client := &http.Client{Timeout: 2 * time.Second}
	if err := waitReady(ctx, p, kwokReadyTimeout, func(ctx context.Context) error {
		_, err := httpGet(ctx, client, "http://"+server+"/healthz", "")
		return err
	}); err != nil {
		return err
	}
	e.logf("testenv: kwok ready in %s", time.Since(begin).Round(time.Millisecond))
	return nil
}

// RestartKwok stops kwok and starts it again with the same stages; the nodes it managed are
// its own again from its first list. After kube-apiserver restarts, kwok's pod controller
// can stall for a minute: in the pool benchmark, of 624 pods created two seconds after a
// restart, 101 turned Running and then none for 60 s, while kwok kept the nodes' leases.
// A fresh kwok lists everything anew.
//
// asKubelets makes kwok a member of system:nodes, as the kubelets it stands in for are, so
// that APF puts its requests in node-high instead of exempt. As the admin, its burst of pod
// deletes at a pool's notice made APF lend workload-high's seats to exempt: at 6 seats,
// workload-high's limit fell from 5 seats to 0, 9 s after the notice, for the rest of the
// window (docs/benchmarks.md).
func (e *Env) RestartKwok(ctx context.Context, asKubelets bool) error {
	kubeconfig := e.Kubeconfig
	if asKubelets {
		var err error
		if kubeconfig, err = e.adminKubeconfigFor(ctx, "kwok", kwokUser, e.kwokToken); err != nil {
			return fmt.Errorf("restarting kwok: %w", err)
		}
	}
	e.stopSlot(&e.kwok)
	if err := e.startKwok(ctx, e.fastPods, kubeconfig); err != nil {
		return fmt.Errorf("restarting kwok: %w", err)
	}
	return nil
}
