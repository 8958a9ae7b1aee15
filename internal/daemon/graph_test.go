package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
)

// trace records the components' starts and closes.
type trace struct{ events []string }

// comp is a component that records its start and close, and fails its
// start with fail when that is not nil (having pushed nothing).
func (tr *trace) comp(name string, requires []string, fail error) component {
	return component{name: name, requires: requires, start: func(d *node, ctx context.Context) error {
		if fail != nil {
			tr.events = append(tr.events, "fail "+name)
			return fail
		}
		tr.events = append(tr.events, "start "+name)
		d.closers.push(func() { tr.events = append(tr.events, "close "+name) })
		return nil
	}}
}

func testNode() *node {
	return &node{log: slog.New(slog.DiscardHandler), out: io.Discard}
}

// The components start after what they require, whatever the order they
// are listed in, serve runs with all of them started, and they close in
// the reverse order of their starts.
func TestComponentsStartInOrderCloseInReverse(t *testing.T) {
	var tr trace
	comps := []component{
		tr.comp("api", []string{"store", "sandboxes"}, nil),
		tr.comp("sandboxes", []string{"store", "backend"}, nil),
		tr.comp("store", []string{"dir"}, nil),
		tr.comp("dir", nil, nil),
		tr.comp("backend", []string{"dir"}, nil),
	}
	err := testNode().run(t.Context(), comps, func(context.Context) error {
		tr.events = append(tr.events, "serve")
		return nil
	})
	want := []string{"start dir", "start store", "start backend", "start sandboxes", "start api", "serve",
		"close api", "close sandboxes", "close backend", "close store", "close dir"}
	if err != nil || !slices.Equal(tr.events, want) {
		t.Fatalf("run = %v, events\n%q\nwant\n%q", err, tr.events, want)
	}
}

// A component that fails to start stops the start: the components after
// it never start, serve never runs, and the ones started close in reverse.
func TestComponentFailureClosesWhatStarted(t *testing.T) {
	var tr trace
	boom := errors.New("boom")
	comps := []component{
		tr.comp("dir", nil, nil),
		tr.comp("store", []string{"dir"}, nil),
		tr.comp("backend", []string{"dir"}, boom),
		tr.comp("sandboxes", []string{"store", "backend"}, nil),
	}
	err := testNode().run(t.Context(), comps, func(context.Context) error {
		tr.events = append(tr.events, "serve")
		return nil
	})
	want := []string{"start dir", "start store", "fail backend", "close store", "close dir"}
	if !errors.Is(err, boom) || !slices.Equal(tr.events, want) {
		t.Fatalf("run = %v, events %q; want boom and %q", err, tr.events, want)
	}
}

// A panic in a start still closes what started, and goes on up.
func TestComponentPanicClosesWhatStarted(t *testing.T) {
	var tr trace
	comps := []component{
		tr.comp("dir", nil, nil),
		{name: "bad", requires: []string{"dir"}, start: func(*node, context.Context) error { panic("bad start") }},
	}
	defer func() {
		if r := recover(); r != "bad start" {
			t.Fatalf("recovered %v, want the start's panic", r)
		}
		if want := []string{"start dir", "close dir"}; !slices.Equal(tr.events, want) {
			t.Fatalf("events %q, want %q", tr.events, want)
		}
	}()
	testNode().run(t.Context(), comps, func(context.Context) error { return nil })
}

// A graph that cannot start (a cycle, an unknown requirement, a name
// twice) is an error before any component starts.
func TestComponentGraphErrors(t *testing.T) {
	for name, comps := range map[string][]component{
		"cycle":     {{name: "a", requires: []string{"b"}}, {name: "b", requires: []string{"c"}}, {name: "c", requires: []string{"a"}}},
		"unknown":   {{name: "a", requires: []string{"nosuch"}}},
		"duplicate": {{name: "a"}, {name: "a"}},
	} {
		err := testNode().run(t.Context(), comps, func(context.Context) error {
			t.Errorf("%s: serve ran", name)
			return nil
		})
		if err == nil || !strings.HasPrefix(err.Error(), "daemon: ") {
			t.Errorf("%s: run = %v, want an error", name, err)
		}
	}
}

// The daemon's own components form a graph that starts, in the order
// they are listed (the order of the lines the daemon prints at start).
func TestDaemonComponentsOrder(t *testing.T) {
	sorted, err := order(components)
	if err != nil {
		t.Fatal(err)
	}
	for i := range components {
		if sorted[i].name != components[i].name {
			t.Fatalf("component %d starts as %q, listed as %q", i, sorted[i].name, components[i].name)
		}
	}
}
