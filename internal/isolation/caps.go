package isolation

// Capabilities (Pauser, Adopter, Keeper, LayerReader, Checkpointer, a
// router's Has and the like) are optional interfaces a backend or sandbox
// implements. A wrapper (a warm pool, a cluster node's naming) changes
// what it must and hands the rest to what it wraps: it implements
//
//	Unwrap() Backend // for a Backend wrapper
//	Unwrap() Sandbox // for a Sandbox wrapper
//
// and callers find a capability with As, never with a type assertion, so
// that every capability of the wrapped value survives every wrapper.
//
// Layers is no such capability: its CreateOn makes sandboxes, which a
// wrapper that changes Create (a cluster node's naming) must see, so a
// Layers is asserted directly or handed over on its own (NamingLayers).
//
// A router of several backends (isolation/multi) is not a wrapper: it has
// no Unwrap, and its own capabilities (Has, Adopt) speak for all of them.

// As returns the first of x and the values its Unwrap chain leads to,
// outermost first, that implements T (as errors.As does for errors): a
// wrapper's own implementation of a capability takes precedence over the
// one it wraps. It reports false when none does, x nil included.
func As[T any](x any) (T, bool) {
	for x != nil {
		if t, ok := x.(T); ok {
			return t, true
		}
		switch u := x.(type) {
		case interface{ Unwrap() Backend }:
			x = u.Unwrap() // a nil Backend or Sandbox is a nil any
		case interface{ Unwrap() Sandbox }:
			x = u.Unwrap() // a nil Backend or Sandbox is a nil any
		default:
			x = nil
		}
	}
	var zero T
	return zero, false
}
