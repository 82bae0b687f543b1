package guard

import (
	"context"
	"encoding/json"
	"fmt"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
)

// certScheme registers Secrets and the meta types every request carries, as agent/kube's Scheme
// does for the agent: not client-go's kubernetes/scheme, which links every API group into the
// binary (docs/benchmarks.md, "Footprint"). The webhook configuration is read and patched as
// JSON (ParseWebhooks, CABundlePatch), so that admissionregistration's types are not linked
// either.
var (
	certScheme     = runtime.NewScheme()
	certCodecs     = serializer.NewCodecFactory(certScheme)
	certParamCodec = runtime.NewParameterCodec(certScheme)
)

// Mirrors k8s.io/client-go/kubernetes/scheme/register.go.
func init() {
	metav1.AddToGroupVersion(certScheme, schema.GroupVersion{Version: "v1"})
	utilruntime.Must(v1.AddToScheme(certScheme))
}

// NewSelfCertClients are SelfCert's clients over cfg: the Secrets of namespace and the
// ValidatingWebhookConfigurations, each built as client-go's generated clients build theirs
// (setConfigDefaults).
func NewSelfCertClients(cfg *rest.Config, namespace string) (SecretClient, WebhookClient, error) {
	hc, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("creating the HTTP client: %w", err)
	}
	client := func(gv schema.GroupVersion, path string) (*rest.RESTClient, error) {
		c := rest.CopyConfig(cfg)
		c.GroupVersion, c.APIPath = &gv, path
		c.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(certScheme, certCodecs).WithoutConversion()
		return rest.RESTClientForConfigAndClient(c, hc)
	}
	core, err := client(v1.SchemeGroupVersion, "/api")
	if err != nil {
		return nil, nil, fmt.Errorf("creating the core/v1 client: %w", err)
	}
	return restSecrets{core, namespace}, restWebhooks{core}, nil
}

type restSecrets struct {
	c  rest.Interface
	ns string
}

func (r restSecrets) Get(ctx context.Context, name string, opts metav1.GetOptions) (*v1.Secret, error) {
	out := &v1.Secret{}
	err := r.c.Get().Namespace(r.ns).Resource("secrets").Name(name).VersionedParams(&opts, certParamCodec).Do(ctx).Into(out)
	return out, err
}

func (r restSecrets) Update(ctx context.Context, s *v1.Secret, opts metav1.UpdateOptions) (*v1.Secret, error) {
	out := &v1.Secret{}
	err := r.c.Put().Namespace(r.ns).Resource("secrets").Name(s.Name).VersionedParams(&opts, certParamCodec).Body(s).Do(ctx).Into(out)
	return out, err
}

type restWebhooks struct{ c rest.Interface }

const webhookConfigurations = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"

func (r restWebhooks) CABundles(ctx context.Context, name string) (Webhooks, error) {
	raw, err := r.c.Get().AbsPath(webhookConfigurations, name).SetHeader("Accept", "application/json").DoRaw(ctx)
	if err != nil {
		return Webhooks{}, err
	}
	return ParseWebhooks(raw)
}

func (r restWebhooks) SetCABundles(ctx context.Context, name string, read Webhooks, bundle []byte) (Webhooks, error) {
	patch, err := CABundlePatch(read, bundle)
	if err != nil {
		return Webhooks{}, err
	}
	raw, err := r.c.Patch(types.JSONPatchType).AbsPath(webhookConfigurations, name).Param("fieldManager", fieldManager).
		SetHeader("Accept", "application/json").Body(patch).DoRaw(ctx)
	if err != nil {
		return Webhooks{}, err
	}
	return ParseWebhooks(raw)
}

// webhookConfiguration is the part of a ValidatingWebhookConfiguration's JSON SelfCert reads.
// caBundle is base64 in JSON, as []byte decodes.
type webhookConfiguration struct {
	Metadata struct {
		ResourceVersion string `json:"resourceVersion"`
	} `json:"metadata"`
	Webhooks []struct {
		Name         string `json:"name"`
		ClientConfig struct {
			CABundle []byte `json:"caBundle"`
		} `json:"clientConfig"`
	} `json:"webhooks"`
}

// ParseWebhooks reads a ValidatingWebhookConfiguration's JSON.
func ParseWebhooks(raw []byte) (Webhooks, error) {
	var c webhookConfiguration
	if err := json.Unmarshal(raw, &c); err != nil {
		return Webhooks{}, fmt.Errorf("decoding a ValidatingWebhookConfiguration: %w", err)
	}
	w := Webhooks{ResourceVersion: c.Metadata.ResourceVersion}
	for _, h := range c.Webhooks {
		w.Names = append(w.Names, h.Name)
		w.CABundles = append(w.CABundles, h.ClientConfig.CABundle)
	}
	return w, nil
}

// CABundlePatch is the JSON patch (RFC 6902) that sets every webhook's caBundle to bundle. Its
// test operations make it fail, rather than write a caBundle into the wrong webhook, when the
// configuration changed since read (its resourceVersion, a webhook's name at its index): as an
// Update with the resourceVersion read would, without the typed object.
func CABundlePatch(read Webhooks, bundle []byte) ([]byte, error) {
	type op struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value any    `json:"value"`
	}
	var ops []op
	if read.ResourceVersion != "" {
		ops = append(ops, op{"test", "/metadata/resourceVersion", read.ResourceVersion})
	}
	for i, name := range read.Names {
		// add sets a member that exists as well (RFC 6902 4.1); []byte encodes as base64.
		ops = append(ops, op{"test", fmt.Sprintf("/webhooks/%d/name", i), name},
			op{"add", fmt.Sprintf("/webhooks/%d/clientConfig/caBundle", i), bundle})
	}
	b, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("encoding the caBundle patch: %w", err)
	}
	return b, nil
}
