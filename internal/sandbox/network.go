package sandbox

import (
	"github.com/fencesandbox/fence/internal/netconf"
	"github.com/fencesandbox/fence/internal/sandbox/fences"
)

// netCore is the Manager as the network side (package fences) reaches
// it: the live sandboxes' network records. New binds it to the Manager's
// fences.Set.
type netCore struct{ m *Manager }

// Sandbox implements fences.Core.
func (c netCore) Sandbox(id string) (fences.Sandbox, error) {
	e, err := c.m.lookup(id)
	if err != nil {
		return nil, err
	}
	return netEntry{e}, nil
}

// AddEgress implements fences.Core: a flow's bytes count in the
// sandbox's usage.
func (c netCore) AddEgress(id string, out, in int64) { c.m.usage.AddEgress(id, out, in) }

// Team implements fences.Core.
func (c netCore) Team(id string) (string, bool) {
	e, err := c.m.lookup(id)
	if err != nil {
		return "", false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return recordTeam(e.info), true
}

// netEntry is one live sandbox as the network side sees it.
type netEntry struct{ e *entry }

// Running implements fences.Sandbox.
func (n netEntry) Running() bool { return n.e.state() == StateRunning }

// Network implements fences.Sandbox.
func (n netEntry) Network() *netconf.Config {
	n.e.mu.Lock()
	defer n.e.mu.Unlock()
	return n.e.net
}

// SetNetwork implements fences.Sandbox.
func (n netEntry) SetNetwork(nc *netconf.Config, show fences.ShowFunc) {
	n.e.mu.Lock()
	defer n.e.mu.Unlock()
	n.e.info.AllowInternetAccess, n.e.info.Network = show(n.e.info.AllowInternetAccess, n.e.info.Network)
	n.e.net = nc
}
