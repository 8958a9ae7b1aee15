package cluster

// DrainRequested reports whether the node's Lease carried the operator's
// fence.dev/drain=true when the node last read it. A renewal after the
// operator's change conflicts and reads the Lease again, so the answer
// follows the annotation within a renewal period.
func (r *Registrar) DrainRequested() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lease != nil && r.lease.Annotations[AnnotationDrain] == "true"
}
