package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
)

// events is EventInterface: a resource client and the requests of client-go's EventExpansion
// (k8s.io/client-go/kubernetes/typed/core/v1/event_expansion.go), which send each event to its
// own namespace.
type events struct {
	*resource[*corev1.Event, *corev1.EventList]
}

// CreateWithEventNamespaceWithContext creates event in event's namespace.
func (e events) CreateWithEventNamespaceWithContext(ctx context.Context, event *corev1.Event) (*corev1.Event, error) {
	if e.namespace != "" && event.Namespace != e.namespace {
		return nil, fmt.Errorf("can't create an event with namespace '%v' in namespace '%v'", event.Namespace, e.namespace)
	}
	out := &corev1.Event{}
	err := e.client.Post().
		NamespaceIfScoped(event.Namespace, len(event.Namespace) > 0).
		Resource("events").
		Body(event).
		Do(ctx).
		Into(out)
	return out, err
}

// UpdateWithEventNamespaceWithContext replaces event in event's namespace.
func (e events) UpdateWithEventNamespaceWithContext(ctx context.Context, event *corev1.Event) (*corev1.Event, error) {
	if e.namespace != "" && event.Namespace != e.namespace {
		return nil, fmt.Errorf("can't update an event with namespace '%v' in namespace '%v'", event.Namespace, e.namespace)
	}
	out := &corev1.Event{}
	err := e.client.Put().
		NamespaceIfScoped(event.Namespace, len(event.Namespace) > 0).
		Resource("events").
		Name(event.Name).
		Body(event).
		Do(ctx).
		Into(out)
	return out, err
}

// PatchWithEventNamespaceWithContext patches event (a strategic merge patch of its count and
// times, as the recorder's correlator sends) in event's namespace.
func (e events) PatchWithEventNamespaceWithContext(ctx context.Context, event *corev1.Event, data []byte) (*corev1.Event, error) {
	if e.namespace != "" && event.Namespace != e.namespace {
		return nil, fmt.Errorf("can't patch an event with namespace '%v' in namespace '%v'", event.Namespace, e.namespace)
	}
	out := &corev1.Event{}
	err := e.client.Patch(types.StrategicMergePatchType).
		NamespaceIfScoped(event.Namespace, len(event.Namespace) > 0).
		Resource("events").
		Name(event.Name).
		Body(data).
		Do(ctx).
		Into(out)
	return out, err
}

// EventSink is the event recorder's sink over an EventInterface of every namespace, as
// client-go's typedcorev1.EventSinkImpl (the recorder's own calls take no context).
type EventSink struct {
	Interface EventInterface
}

var _ record.EventSink = &EventSink{}

// Create creates event.
func (s *EventSink) Create(event *corev1.Event) (*corev1.Event, error) {
	return s.Interface.CreateWithEventNamespaceWithContext(context.TODO(), event)
}

// Update replaces event.
func (s *EventSink) Update(event *corev1.Event) (*corev1.Event, error) {
	return s.Interface.UpdateWithEventNamespaceWithContext(context.TODO(), event)
}

// Patch patches event with data.
func (s *EventSink) Patch(event *corev1.Event, data []byte) (*corev1.Event, error) {
	return s.Interface.PatchWithEventNamespaceWithContext(context.TODO(), event, data)
}
