// Package egresstest holds test helpers for the egress packages and their
// users: a fake authoritative DNS server that logs every query, and a
// user-space "sandbox side" network stack wired to an egress stack through
// an in-memory link, so that forwarding, DNS and policy can be tested end
// to end in one process without root.
//
// It is for tests only; nothing in it is hardened.
package egresstest

import (
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"

	mdns "github.com/miekg/dns"
)

// DNSServer is a fake authoritative DNS server on 127.0.0.1 (UDP and TCP,
// same port) that answers A/AAAA from a table and logs every question.
type DNSServer struct {
	Addr string // "127.0.0.1:port"

	mu      sync.Mutex
	zone    map[string][]netip.Addr
	ttl     map[string]uint32 // per-name TTL; 60 when absent
	queries []string
	udp     *mdns.Server
	tcp     *mdns.Server
}

// NewDNSServer starts a server answering from zone (name → addresses; a
// name not in zone gets NXDOMAIN). It stops when the test ends.
func NewDNSServer(t testing.TB, zone map[string][]string) *DNSServer {
	t.Helper()
	s := &DNSServer{zone: map[string][]netip.Addr{}, ttl: map[string]uint32{}}
	for n, as := range zone {
		s.Set(n, as...)
	}
	// UDP and TCP on the same port: retry when the TCP port is taken.
	var pc net.PacketConn
	var l net.Listener
	for i := 0; ; i++ {
		var err error
		pc, err = net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("listening udp: %v", err)
		}
		l, err = net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			break
		}
		pc.Close()
		if i == 20 {
			t.Fatalf("listening tcp: %v", err)
		}
	}
	s.Addr = pc.LocalAddr().String()
	s.udp = &mdns.Server{PacketConn: pc, Handler: s}
	s.tcp = &mdns.Server{Listener: l, Handler: s}
	started := make(chan struct{}, 2)
	s.udp.NotifyStartedFunc = func() { started <- struct{}{} }
	s.tcp.NotifyStartedFunc = func() { started <- struct{}{} }
	go s.udp.ActivateAndServe()
	go s.tcp.ActivateAndServe()
	<-started
	<-started
	t.Cleanup(func() {
		s.udp.Shutdown()
		s.tcp.Shutdown()
	})
	return s
}

// Set replaces the addresses of name (for DNS-rebinding tests).
func (s *DNSServer) Set(name string, addrs ...string) {
	var as []netip.Addr
	for _, a := range addrs {
		as = append(as, netip.MustParseAddr(a))
	}
	s.mu.Lock()
	s.zone[mdns.Fqdn(strings.ToLower(name))] = as
	s.mu.Unlock()
}

// SetTTL sets the TTL of name's answers (default 60 s). A rebinding
// attacker answers with TTL 0, which no cache keeps.
func (s *DNSServer) SetTTL(name string, ttl uint32) {
	s.mu.Lock()
	s.ttl[mdns.Fqdn(strings.ToLower(name))] = ttl
	s.mu.Unlock()
}

// Queries returns every question received so far as "name TYPE".
func (s *DNSServer) Queries() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.queries...)
}

// ServeDNS implements mdns.Handler.
func (s *DNSServer) ServeDNS(w mdns.ResponseWriter, q *mdns.Msg) {
	m := new(mdns.Msg)
	m.SetReply(q)
	m.Authoritative = true
	s.mu.Lock()
	for _, qs := range q.Question {
		s.queries = append(s.queries, strings.ToLower(qs.Name)+" "+mdns.TypeToString[qs.Qtype])
		as, ok := s.zone[strings.ToLower(qs.Name)]
		if !ok {
			m.Rcode = mdns.RcodeNameError
			continue
		}
		ttl, ok := s.ttl[strings.ToLower(qs.Name)]
		if !ok {
			ttl = 60
		}
		for _, a := range as {
			hdr := mdns.RR_Header{Name: qs.Name, Class: mdns.ClassINET, Ttl: ttl}
			switch {
			case a.Is4() && qs.Qtype == mdns.TypeA:
				hdr.Rrtype = mdns.TypeA
				m.Answer = append(m.Answer, &mdns.A{Hdr: hdr, A: a.AsSlice()})
			case a.Is6() && qs.Qtype == mdns.TypeAAAA:
				hdr.Rrtype = mdns.TypeAAAA
				m.Answer = append(m.Answer, &mdns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
			}
		}
	}
	s.mu.Unlock()
	w.WriteMsg(m)
}
