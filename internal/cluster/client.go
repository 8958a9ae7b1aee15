package cluster

import (
	"context"
	"fmt"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// NewClient returns a Kubernetes client from the kubeconfig file at path,
// or from the pod's service account when path is empty (in-cluster).
//
// It is the dynamic client: the cluster layer uses one resource (Leases),
// and the typed clientset links every API group of Kubernetes, whose
// registration at start made every start of the fence binary (each
// sandbox's init and agent included) take about twice as long.
func NewClient(path, userAgent string) (dynamic.Interface, error) {
	var cfg *rest.Config
	var err error
	if path == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.UserAgent = userAgent
	cfg.QPS, cfg.Burst = 20, 40
	c, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return c, nil
}

// leaseResource is coordination.k8s.io/v1 Leases.
var leaseResource = schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}

// leases is the Leases of one namespace, typed, over the dynamic client.
type leases struct{ r dynamic.ResourceInterface }

func newLeases(c dynamic.Interface, namespace string) leases {
	return leases{r: c.Resource(leaseResource).Namespace(namespace)}
}

func (l leases) List(ctx context.Context, o metav1.ListOptions) (*coordv1.LeaseList, error) {
	u, err := l.r.List(ctx, o)
	if err != nil {
		return nil, err
	}
	out := &coordv1.LeaseList{ListMeta: metav1.ListMeta{ResourceVersion: u.GetResourceVersion(), Continue: u.GetContinue()}}
	out.Items = make([]coordv1.Lease, len(u.Items))
	for i := range u.Items {
		if err := fromUnstructured(&u.Items[i], &out.Items[i]); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func (l leases) Get(ctx context.Context, name string) (*coordv1.Lease, error) {
	u, err := l.r.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return toLease(u)
}

func (l leases) Create(ctx context.Context, lease *coordv1.Lease) (*coordv1.Lease, error) {
	u, err := toUnstructured(lease)
	if err != nil {
		return nil, err
	}
	if u, err = l.r.Create(ctx, u, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	return toLease(u)
}

func (l leases) Update(ctx context.Context, lease *coordv1.Lease) (*coordv1.Lease, error) {
	u, err := toUnstructured(lease)
	if err != nil {
		return nil, err
	}
	if u, err = l.r.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		return nil, err
	}
	return toLease(u)
}

// Watch watches the Leases; its events carry *coordv1.Lease (and
// *metav1.Status for errors).
func (l leases) Watch(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
	w, err := l.r.Watch(ctx, o)
	if err != nil {
		return nil, err
	}
	return watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
		if u, ok := ev.Object.(*unstructured.Unstructured); ok {
			lease, err := toLease(u)
			if err != nil {
				return watch.Event{Type: watch.Error, Object: &metav1.Status{Status: metav1.StatusFailure, Message: err.Error()}}, true
			}
			ev.Object = lease
		}
		return ev, true
	}), nil
}

func toLease(u *unstructured.Unstructured) (*coordv1.Lease, error) {
	var l coordv1.Lease
	if err := fromUnstructured(u, &l); err != nil {
		return nil, err
	}
	return &l, nil
}

func fromUnstructured(u *unstructured.Unstructured, l *coordv1.Lease) error {
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), l); err != nil {
		return fmt.Errorf("decoding lease %q: %w", u.GetName(), err)
	}
	return nil
}

func toUnstructured(l *coordv1.Lease) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(l)
	if err != nil {
		return nil, fmt.Errorf("encoding lease %q: %w", l.Name, err)
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetAPIVersion("coordination.k8s.io/v1")
	u.SetKind("Lease")
	return u, nil
}
