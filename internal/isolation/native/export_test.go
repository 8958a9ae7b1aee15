package native

// Forget drops a sandbox from the backend's memory without killing it, as
// a daemon crash would.
func (b *Backend) Forget(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.live, id)
}

// LayersDir is where the backend keeps its layers.
func (b *Backend) LayersDir() string { return b.layersDir() }
