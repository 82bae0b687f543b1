package kube

import (
	"context"
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/rest"
)

// discovery reads /version, as client-go's DiscoveryClient.ServerVersion; the rest of the
// discovery client (the groups, their resources, the OpenAPI documents) is not linked.
type discovery struct{ c rest.Interface }

// ServerVersion is the API server's version.
func (d discovery) ServerVersion() (*version.Info, error) {
	body, err := d.c.Get().AbsPath("/version").Do(context.TODO()).Raw()
	if err != nil {
		return nil, err
	}
	var info version.Info
	if err := json.Unmarshal(body, &info); err != nil {
		return nil, fmt.Errorf("unable to parse the server version: %w", err)
	}
	return &info, nil
}
