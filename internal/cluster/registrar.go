package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
)

// Defaults of a Registrar.
const (
	DefaultRenewEvery    = 3 * time.Second
	DefaultLeaseDuration = 10 * time.Second
)

// RegistrarOptions configure a node's registration.
type RegistrarOptions struct {
	Client    dynamic.Interface // required
	Namespace string            // required
	Name      string            // required; ValidName
	URL       string            // required: where routers reach the node
	Version   string
	// Load returns the node's capacity, running sandboxes and templates;
	// called before every renewal. Required.
	Load func() (capacity, running int, templates []string)
	// RenewEvery is the renewal period (DefaultRenewEvery if zero);
	// LeaseDuration how long a Lease not renewed stays live
	// (DefaultLeaseDuration if zero).
	RenewEvery, LeaseDuration time.Duration
	Logger                    *slog.Logger
}

// Registrar keeps a node's Lease renewed.
type Registrar struct {
	opts     RegistrarOptions
	log      *slog.Logger
	mu       sync.Mutex
	lease    *coordv1.Lease // last written
	draining bool
}

// Register creates or takes over the node's Lease and publishes its Status
// once. It fails when another live node's Lease carries the same tag.
func Register(ctx context.Context, opts RegistrarOptions) (*Registrar, error) {
	if opts.Client == nil || opts.Namespace == "" || opts.URL == "" || opts.Load == nil {
		return nil, errors.New("cluster: Client, Namespace, URL and Load are required")
	}
	if err := ValidName(opts.Name); err != nil {
		return nil, err
	}
	if opts.RenewEvery <= 0 {
		opts.RenewEvery = DefaultRenewEvery
	}
	if opts.LeaseDuration <= 0 {
		opts.LeaseDuration = DefaultLeaseDuration
	}
	r := &Registrar{opts: opts, log: opts.Logger}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if err := r.checkTag(ctx); err != nil {
		return nil, err
	}
	if err := r.renew(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// checkTag refuses a tag already used by another node whose Lease is
// still renewed (judged by its renewTime against this host's clock, with
// the lease duration as margin).
func (r *Registrar) checkTag(ctx context.Context) error {
	list, err := newLeases(r.opts.Client, r.opts.Namespace).List(ctx,
		metav1.ListOptions{LabelSelector: LabelComponent + "=" + NodeComponent})
	if err != nil {
		return fmt.Errorf("listing node leases: %w", err)
	}
	tag := Tag(r.opts.Name)
	for i := range list.Items {
		l := &list.Items[i]
		st, ok := statusOf(l)
		if !ok || st.Name == r.opts.Name || st.Tag != tag {
			continue
		}
		if l.Spec.RenewTime != nil && time.Since(l.Spec.RenewTime.Time) < 2*r.opts.LeaseDuration {
			return fmt.Errorf("cluster: node %q has the same tag %q as live node %q: rename one", r.opts.Name, tag, st.Name)
		}
	}
	return nil
}

// Run renews the Lease every RenewEvery until ctx is done. Failures are
// logged and retried at the next period.
func (r *Registrar) Run(ctx context.Context) {
	t := time.NewTicker(r.opts.RenewEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if err := r.renew(ctx); err != nil && ctx.Err() == nil {
			r.log.WarnContext(ctx, "renewing the node's lease", "err", err)
		}
	}
}

// Drain publishes at once that the node takes no new sandbox.
func (r *Registrar) Drain(ctx context.Context) error {
	r.mu.Lock()
	r.draining = true
	r.mu.Unlock()
	return r.renew(ctx)
}

// Release ends the node's Lease: it is published as not held, so routers
// drop the node at once instead of after the lease duration. The Lease
// object stays (a node may not delete Leases).
func (r *Registrar) Release(ctx context.Context) error {
	return r.write(ctx, func(l *coordv1.Lease) {
		l.Spec.HolderIdentity = nil
		l.Spec.RenewTime = nil
	})
}

func (r *Registrar) status() Status {
	capacity, running, templates := r.opts.Load()
	r.mu.Lock()
	defer r.mu.Unlock()
	return Status{Name: r.opts.Name, Tag: Tag(r.opts.Name), URL: r.opts.URL, Capacity: capacity,
		Running: running, Templates: templates, Version: r.opts.Version, Draining: r.draining}
}

func (r *Registrar) renew(ctx context.Context) error {
	st := r.status()
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	holder := r.opts.Name
	secs := int32(r.opts.LeaseDuration / time.Second)
	return r.write(ctx, func(l *coordv1.Lease) {
		now := metav1.NewMicroTime(time.Now())
		if l.Labels == nil {
			l.Labels = map[string]string{}
		}
		l.Labels[LabelComponent] = NodeComponent
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[AnnotationNode] = string(b)
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != holder {
			l.Spec.AcquireTime = &now
		}
		l.Spec.HolderIdentity = &holder
		l.Spec.LeaseDurationSeconds = &secs
		l.Spec.RenewTime = &now
	})
}

// write applies change to the Lease and stores it, creating it if missing
// and reading it again after a conflict (an operator's annotation).
func (r *Registrar) write(ctx context.Context, change func(*coordv1.Lease)) error {
	leases := newLeases(r.opts.Client, r.opts.Namespace)
	r.mu.Lock()
	cur := r.lease
	r.mu.Unlock()
	for attempt := 0; attempt < 3; attempt++ {
		if cur == nil {
			got, err := leases.Get(ctx, LeaseName(r.opts.Name))
			switch {
			case apierrors.IsNotFound(err):
				l := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: LeaseName(r.opts.Name), Namespace: r.opts.Namespace}}
				change(l)
				created, err := leases.Create(ctx, l)
				if apierrors.IsAlreadyExists(err) {
					continue
				}
				if err != nil {
					return fmt.Errorf("creating lease: %w", err)
				}
				r.keep(created)
				return nil
			case err != nil:
				return fmt.Errorf("reading lease: %w", err)
			}
			cur = got
		}
		l := cur.DeepCopy()
		change(l)
		updated, err := leases.Update(ctx, l)
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			cur = nil
			continue
		}
		if err != nil {
			return fmt.Errorf("updating lease: %w", err)
		}
		r.keep(updated)
		return nil
	}
	return errors.New("updating lease: conflicts kept coming")
}

func (r *Registrar) keep(l *coordv1.Lease) {
	r.mu.Lock()
	r.lease = l
	r.mu.Unlock()
}

// statusOf reads a Lease's Status annotation.
func statusOf(l *coordv1.Lease) (Status, bool) {
	var st Status
	raw, ok := l.Annotations[AnnotationNode]
	if !ok || json.Unmarshal([]byte(raw), &st) != nil || st.Name == "" || LeaseName(st.Name) != l.Name {
		return Status{}, false
	}
	return st, true
}
