package kube_test

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/reprieve-dev/reprieve/agent/kube"
	"github.com/reprieve-dev/reprieve/agent/kube/kubetest"
)

// TestListPodMetadataOnTheFakeClientset: client-go's fake clientset has no REST client (a nil
// *rest.RESTClient); the list is an error there, which callers treat as an unanswered server.
func TestListPodMetadataOnTheFakeClientset(t *testing.T) {
	c := kubetest.Wrap(fake.NewClientset())
	if _, err := kube.ListPodMetadata(context.Background(), c, "", metav1.ListOptions{}); err == nil {
		t.Error("ListPodMetadata on the fake clientset: no error; want one")
	}
}
