package native

// Forget drops a sandbox from the backend's memory without killing it, as
// a daemon crash would.
func (b *Backend) Forget(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.live, id)
}
