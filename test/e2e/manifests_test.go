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
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dyn, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(env.Client.Discovery()))
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "deploy", "manifests", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	applied := 0
	for _, file := range files {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(b)))
		for {
			doc, err := r.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			obj := &unstructured.Unstructured{}
			if err := utilyaml.Unmarshal(doc, &obj.Object); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			gvk := obj.GroupVersionKind()
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				t.Errorf("%s: %s: %v", file, gvk, err)
				continue
			}
			data, err := obj.MarshalJSON()
			if err != nil {
				t.Fatal(err)
			}
			var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
			if ns := obj.GetNamespace(); ns != "" {
				ri = dyn.Resource(m.Resource).Namespace(ns)
			}
			force := true
			if _, err := ri.Patch(ctx, obj.GetName(), types.ApplyPatchType, data, metav1.PatchOptions{
				FieldManager: "reprieve-e2e", DryRun: []string{metav1.DryRunAll}, Force: &force, FieldValidation: "Strict"}); err != nil {
				t.Errorf("%s: %s %s: %v", filepath.Base(file), gvk.Kind, obj.GetName(), err)
			}
			applied++
		}
	}
	t.Logf("%d objects from %d files applied with a server-side dry run", applied, len(files))
}
