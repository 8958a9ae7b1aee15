package timetravel

import (
	"sync"
	"sync/atomic"
)

// layerLock orders the layer collector (gc) against what makes, records
// and reads layers, so that gc never deletes a layer that is being made
// and not yet recorded, or read.
//
// Whatever makes and records a layer holds it for reading (RLock) until
// the layer is recorded or used. A reader of layers (a diff) holds it
// only while it pins the layers it will read (Pin): it reads their files
// after RUnlock, and gc keeps every pinned layer, with its parents, until
// Unpin.
//
// gc takes it for writing with TryLock and never waits for it: a writer
// waiting on a sync.RWMutex holds every new reader back, so one long
// reader (a checkpoint copying a large layer) would stall the layer
// operations of every sandbox behind a waiting gc. A gc that finds it
// held returns errLayersBusy and runs again when the last reader leaves
// (the lock calls wake); a gc that kept pinned layers runs again when
// the last pin goes.
type layerLock struct {
	mu sync.RWMutex
	// wake asks the collector to run (non-blocking).
	wake func()
	// missed is set by a gc that found mu held.
	missed atomic.Bool

	pinMu sync.Mutex
	// pins counts the readers of each pinned layer.
	// +checklocks:pinMu
	pins map[string]int
	// pinKept is set by a gc that ran while layers were pinned.
	// +checklocks:pinMu
	pinKept bool
}

// +checklocksignore: a wrapper of mu, which guards no field.
func (l *layerLock) RLock() { l.mu.RLock() }

// RUnlock releases a read lock and wakes a gc that missed the lock.
//
// +checklocksignore: a wrapper of mu, which guards no field.
func (l *layerLock) RUnlock() {
	l.mu.RUnlock()
	if l.missed.Load() && l.wake != nil {
		l.wake()
	}
}

// TryLock takes the lock for writing if no one holds it; else it
// reports false and the last reader out wakes the collector.
//
// +checklocksignore: a wrapper of mu, which guards no field.
func (l *layerLock) TryLock() bool {
	l.missed.Store(true) // before trying: a reader leaving meanwhile wakes
	if !l.mu.TryLock() {
		return false
	}
	l.missed.Store(false)
	return true
}

// +checklocksignore: a wrapper of mu, which guards no field.
func (l *layerLock) Unlock() { l.mu.Unlock() }

// Pin keeps layers (and, through them, their parents) from gc until
// Unpin. The caller holds the lock for reading, so that no gc runs
// between its finding the layers and pinning them.
func (l *layerLock) Pin(layers ...string) {
	l.pinMu.Lock()
	defer l.pinMu.Unlock()
	if l.pins == nil {
		l.pins = map[string]int{}
	}
	for _, id := range layers {
		if id != "" {
			l.pins[id]++
		}
	}
}

// Unpin drops pins that Pin took; a gc that ran meanwhile runs again
// once no layer is pinned.
func (l *layerLock) Unpin(layers ...string) {
	l.pinMu.Lock()
	for _, id := range layers {
		if id == "" {
			continue
		}
		if l.pins[id]--; l.pins[id] <= 0 {
			delete(l.pins, id)
		}
	}
	rerun := len(l.pins) == 0 && l.pinKept
	if rerun {
		l.pinKept = false
	}
	l.pinMu.Unlock()
	if rerun && l.wake != nil {
		l.wake()
	}
}

// pinned returns the pinned layers; gc calls it holding the lock for
// writing.
func (l *layerLock) pinned() []string {
	l.pinMu.Lock()
	defer l.pinMu.Unlock()
	out := make([]string, 0, len(l.pins))
	for id := range l.pins {
		out = append(out, id)
	}
	l.pinKept = len(out) > 0
	return out
}
