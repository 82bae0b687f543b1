package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/strategicpatch"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/restmapper"
)

// lastApplied is the annotation kubectl apply (client-side) keeps its last manifest in.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// applier applies rendered manifests to the test's API server the two ways GitOps tools do:
// kubectl's client-side apply (Argo CD's default, and Helm 3's upgrade, which patches with the
// same three-way strategic merge) and server-side apply (Argo CD's ServerSideApply=true, Flux).
type applier struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func newApplier(t *testing.T) *applier {
	t.Helper()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return &applier{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(env.Client.Discovery()))}
}

func (a *applier) resource(obj *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := obj.GroupVersionKind()
	m, err := a.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("mapping %s: %w", gvk, err)
	}
	if ns := obj.GetNamespace(); ns != "" {
		return a.dyn.Resource(m.Resource).Namespace(ns), nil
	}
	return a.dyn.Resource(m.Resource), nil
}

// clientSide is `kubectl apply` without --server-side, as kubectl's apply.Patcher does it: create
// with the manifest in the last-applied annotation; else a three-way strategic merge patch
// (strategicpatch.CreateThreeWayMergePatch) of the last-applied manifest, the new one and the
// live object, with the built-in type's patch metadata, so that a field set by someone else and
// in neither manifest (the guard's caBundle, its Secret's data) is left alone.
func (a *applier) clientSide(ctx context.Context, t *testing.T, objs []*unstructured.Unstructured) {
	t.Helper()
	for _, obj := range objs {
		obj = obj.DeepCopy()
		ri, err := a.resource(obj)
		if err != nil {
			t.Fatal(err)
		}
		ann := obj.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		delete(ann, lastApplied)
		obj.SetAnnotations(ann)
		modified, err := obj.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		ann[lastApplied] = string(modified)
		obj.SetAnnotations(ann)
		modified, err = obj.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		live, err := ri.Get(ctx, obj.GetName(), metav1.GetOptions{})
		if err != nil {
			if _, err := ri.Create(ctx, obj, metav1.CreateOptions{FieldManager: "kubectl-client-side-apply"}); err != nil {
				t.Fatalf("creating %s %s: %v", obj.GetKind(), obj.GetName(), err)
			}
			continue
		}
		current, err := live.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		typed, err := scheme.Scheme.New(obj.GroupVersionKind())
		if err != nil {
			t.Fatalf("%s is not a built-in type: %v", obj.GroupVersionKind(), err)
		}
		lookup, err := strategicpatch.NewPatchMetaFromStruct(typed)
		if err != nil {
			t.Fatal(err)
		}
		original := []byte(live.GetAnnotations()[lastApplied])
		patch, err := strategicpatch.CreateThreeWayMergePatch(original, modified, current, lookup, true)
		if err != nil {
			t.Fatalf("%s %s: the three-way patch: %v", obj.GetKind(), obj.GetName(), err)
		}
		if _, err := ri.Patch(ctx, obj.GetName(), types.StrategicMergePatchType, patch, metav1.PatchOptions{FieldManager: "kubectl-client-side-apply"}); err != nil {
			t.Fatalf("applying %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
}

// serverSide is a server-side apply with force, as Argo CD's ServerSideApply=true and Flux do,
// under the manager name given.
func (a *applier) serverSide(ctx context.Context, t *testing.T, manager string, objs []*unstructured.Unstructured) {
	t.Helper()
	force := true
	for _, obj := range objs {
		ri, err := a.resource(obj)
		if err != nil {
			t.Fatal(err)
		}
		data, err := json.Marshal(obj.Object)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{FieldManager: manager, Force: &force}); err != nil {
			t.Fatalf("server-side applying %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
	}
}

// deleteAll deletes objs (a test's cleanup).
func (a *applier) deleteAll(ctx context.Context, objs []*unstructured.Unstructured) {
	for _, obj := range objs {
		if ri, err := a.resource(obj); err == nil {
			_ = ri.Delete(ctx, obj.GetName(), metav1.DeleteOptions{})
		}
	}
}
