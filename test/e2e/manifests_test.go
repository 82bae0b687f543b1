package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"
)

// TestManifestsApplyServerDryRun applies every object of deploy/manifests/ as
// `kubectl apply --server-side --dry-run=server` would: the real API server validates, defaults
// and admits each one (schemas with unknown fields refused, CEL of the admission policies)
// without keeping it.
func TestManifestsApplyServerDryRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "deploy", "manifests", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	d := newDryRunner(t)
	applied := 0
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		applied += d.apply(ctx, t, filepath.Base(file), b)
	}
	t.Logf("%d objects from %d files applied with a server-side dry run", applied, len(files))
}

// dryRunner applies manifests with a server-side dry run on the test's API server.
type dryRunner struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
}

func newDryRunner(t *testing.T) *dryRunner {
	t.Helper()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return &dryRunner{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(env.Client.Discovery()))}
}

// apply server-side applies every object of manifest (a multi-document YAML) with
// dryRun=All and strict field validation, reports each refusal as an error of t naming source,
// and returns how many objects it applied.
func (d *dryRunner) apply(ctx context.Context, t *testing.T, source string, manifest []byte) int {
	t.Helper()
	applied := 0
	for _, obj := range manifestObjects(t, source, manifest) {
		gvk := obj.GroupVersionKind()
		m, err := d.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Errorf("%s: %s: %v", source, gvk, err)
			continue
		}
		data, err := obj.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		var ri dynamic.ResourceInterface = d.dyn.Resource(m.Resource)
		if ns := obj.GetNamespace(); ns != "" {
			ri = d.dyn.Resource(m.Resource).Namespace(ns)
		}
		force := true
		if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{
			FieldManager: "reprieve-e2e", DryRun: []string{metav1.DryRunAll}, Force: &force, FieldValidation: "Strict"}); err != nil {
			t.Errorf("%s: %s %s: %v", source, gvk.Kind, obj.GetName(), err)
		}
		applied++
	}
	return applied
}

// manifestObjects returns the objects of a multi-document YAML, skipping empty documents.
func manifestObjects(t *testing.T, source string, manifest []byte) []*unstructured.Unstructured {
	t.Helper()
	var objs []*unstructured.Unstructured
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(manifest)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		obj := &unstructured.Unstructured{}
		if err := utilyaml.Unmarshal(doc, &obj.Object); err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		if len(obj.Object) == 0 { // only comments or blank
			continue
		}
		objs = append(objs, obj)
	}
}
