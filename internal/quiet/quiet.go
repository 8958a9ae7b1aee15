// Package quiet tells whether an event came after a quiet spell.
//
// fence's pools keep parts of sandboxes ready ahead of the creates (inits,
// formatted disks, whole sandboxes) and replace what a create takes. A
// create that comes after a quiet spell is usually followed at once by its
// sandbox's first command, which a replacement started at once would run
// beside; the pools hold such a replacement back a little. This package is
// their one definition of "after a quiet spell".
//
// # Guarantees
//
//   - Note reports true for the first event it records and for an event
//     more than Spell after the one before, false otherwise.
//   - Events is safe for concurrent use; its zero value is ready.
package quiet

import (
	"sync/atomic"
	"time"
)

// Spell is how long no event must have come for the next to be quiet.
const Spell = time.Second

// Events records when events came.
type Events struct {
	last atomic.Int64 // UnixNano of the last event; 0: none yet
}

// Note records an event now and reports whether it came after a quiet
// spell (or is the first).
func (e *Events) Note() bool {
	now := time.Now().UnixNano()
	return now-e.last.Swap(now) > int64(Spell)
}
