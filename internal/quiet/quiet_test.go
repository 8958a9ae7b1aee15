package quiet

import "testing"

func TestNote(t *testing.T) {
	var e Events
	if !e.Note() {
		t.Error("the first event is not quiet")
	}
	if e.Note() {
		t.Error("an event right after another is quiet")
	}
	e.last.Add(-int64(Spell) - 1) // the last one a spell ago
	if !e.Note() {
		t.Error("an event a spell after the last is not quiet")
	}
}
