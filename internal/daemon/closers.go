package daemon

// closers is the daemon's teardown: each component pushes what undoes it
// as soon as it is made, and close runs them last made first. A component
// that fails to start has pushed nothing it did not finish, so close after
// a failed start undoes exactly what was started.
type closers []func()

// push adds f to run before everything pushed earlier.
func (c *closers) push(f func()) { *c = append(*c, f) }

// close runs the pushed functions in reverse order, once.
func (c *closers) close() {
	for len(*c) > 0 {
		last := len(*c) - 1
		f := (*c)[last]
		*c = (*c)[:last]
		f()
	}
}
