package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
)

// Node is a node as a router sees it.
type Node struct {
	Status
	// Drained is the operator's fence.dev/drain=true.
	Drained bool
	// Expires is when the node is dead unless its Lease is renewed first
	// (the router's clock).
	Expires time.Time
}

// Placeable reports whether new sandboxes may go to the node.
func (n Node) Placeable() bool { return !n.Drained && !n.Draining }

// Free is how many more sandboxes the node takes.
func (n Node) Free() int { return n.Capacity - n.Running }

// HasTemplate reports whether the node published template name.
func (n Node) HasTemplate(name string) bool { return slices.Contains(n.Templates, name) }

// Watcher keeps the nodes of one namespace, from one watch on their Leases.
type Watcher struct {
	log *slog.Logger
	now func() time.Time
	mu  sync.RWMutex
	// byTag holds every node with a readable Status, live or not.
	byTag map[string]*Node
	// tagOf maps Lease names to tags, for deletions.
	tagOf map[string]string
}

// Watch starts watching the node Leases of namespace and returns once the
// first listing is in (at most a minute). It stops when ctx is done.
func Watch(ctx context.Context, client dynamic.Interface, namespace string, log *slog.Logger) (*Watcher, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Watcher{log: log, now: time.Now, byTag: map[string]*Node{}, tagOf: map[string]string{}}
	leases := newLeases(client, namespace)
	selector := LabelComponent + "=" + NodeComponent
	inf := cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return leases.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return leases.Watch(ctx, o)
		},
	}, client), &coordv1.Lease{}, 0, cache.Indexers{})
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { w.update(obj) },
		UpdateFunc: func(_, obj any) { w.update(obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if l, ok := obj.(*coordv1.Lease); ok {
				w.remove(l.Name)
			}
		},
	}); err != nil {
		return nil, fmt.Errorf("watching node leases: %w", err)
	}
	go inf.RunWithContext(ctx)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), inf.HasSynced) {
		return nil, fmt.Errorf("listing node leases in %q: %w", namespace, context.Cause(sctx))
	}
	return w, nil
}

func (w *Watcher) update(obj any) {
	l, ok := obj.(*coordv1.Lease)
	if !ok {
		return
	}
	st, ok := statusOf(l)
	if !ok || st.Tag != Tag(st.Name) {
		w.log.Warn("ignoring a node lease without a valid status", "lease", l.Name)
		w.remove(l.Name)
		return
	}
	now := w.now()
	n := &Node{Status: st, Drained: l.Annotations[AnnotationDrain] == "true"}
	held := l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity == st.Name && l.Spec.RenewTime != nil
	if held {
		d := DefaultLeaseDuration
		if l.Spec.LeaseDurationSeconds != nil {
			d = time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
		}
		// Seen renewed now, unless the renewal is already older than the
		// lease (a node long dead when the watch starts).
		n.Expires = now.Add(d)
		if exp := l.Spec.RenewTime.Add(d); exp.Before(now) {
			n.Expires = exp
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if old, ok := w.byTag[st.Tag]; ok && old.Name != st.Name && old.Expires.After(now) {
		w.log.Error("two live nodes share a tag; keeping the first", "tag", st.Tag, "first", old.Name, "second", st.Name)
		return
	}
	if prev, ok := w.tagOf[l.Name]; ok && prev != st.Tag {
		delete(w.byTag, prev)
	}
	w.byTag[st.Tag] = n
	w.tagOf[l.Name] = st.Tag
}

func (w *Watcher) remove(lease string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if tag, ok := w.tagOf[lease]; ok {
		if n := w.byTag[tag]; n != nil && LeaseName(n.Name) == lease {
			delete(w.byTag, tag)
		}
		delete(w.tagOf, lease)
	}
}

// Node returns the live node with tag.
func (w *Watcher) Node(tag string) (Node, bool) {
	w.mu.RLock()
	n, ok := w.byTag[tag]
	w.mu.RUnlock()
	if !ok || !n.Expires.After(w.now()) {
		return Node{}, false
	}
	return *n, true
}

// Nodes returns the live nodes, by name.
func (w *Watcher) Nodes() []Node {
	now := w.now()
	w.mu.RLock()
	out := make([]Node, 0, len(w.byTag))
	for _, n := range w.byTag {
		if n.Expires.After(now) {
			out = append(out, *n)
		}
	}
	w.mu.RUnlock()
	slices.SortFunc(out, func(a, b Node) int {
		if a.Name < b.Name {
			return -1
		}
		if a.Name > b.Name {
			return 1
		}
		return 0
	})
	return out
}
