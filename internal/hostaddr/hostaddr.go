// Package hostaddr keeps the set of the host's own addresses current.
//
// A [Set] is read on every flow a sandbox opens (through the egress
// policy), so Contains is a lock-free lookup in an immutable map that is
// swapped atomically. [Watch] subscribes to the kernel's address
// notifications (RTM_NEWADDR and RTM_DELADDR on a NETLINK_ROUTE socket,
// IPv4 and IPv6) and re-reads every interface address on each of them, so
// an address added after the daemon started (a new interface, DHCP, a VPN)
// is never reachable from a sandbox once the kernel has announced it.
//
// # Guarantees
//
//   - The set is subscribed before it is first read: no change between the
//     read and the subscription is missed. A lost notification (the socket's
//     buffer overflowed, ENOBUFS) also triggers a full re-read.
//   - Addresses are kept without zone and with IPv4-mapped addresses
//     unmapped, as the egress policy compares them.
//   - The watch's goroutine and socket end with its context (or Close).
package hostaddr

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Set is a set of host addresses, safe for concurrent use.
type Set struct {
	addrs atomic.Pointer[map[netip.Addr]struct{}]
	// read returns the current addresses (tests replace it).
	read func() ([]netip.Addr, error)

	mu     sync.Mutex
	closed bool
	sock   *os.File
	done   chan struct{}
}

// Static returns a set of fixed addresses that never changes.
func Static(addrs ...netip.Addr) *Set {
	s := &Set{}
	s.store(addrs)
	return s
}

// Contains reports whether a is one of the host's addresses.
func (s *Set) Contains(a netip.Addr) bool {
	if s == nil {
		return false
	}
	m := s.addrs.Load()
	if m == nil {
		return false
	}
	_, ok := (*m)[norm(a)]
	return ok
}

// Addrs returns the current addresses, sorted.
func (s *Set) Addrs() []netip.Addr {
	if s == nil {
		return nil
	}
	m := s.addrs.Load()
	if m == nil {
		return nil
	}
	out := make([]netip.Addr, 0, len(*m))
	for a := range *m {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b netip.Addr) int { return a.Compare(b) })
	return out
}

func norm(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

func (s *Set) store(addrs []netip.Addr) {
	m := make(map[netip.Addr]struct{}, len(addrs))
	for _, a := range addrs {
		if a.IsValid() {
			m[norm(a)] = struct{}{}
		}
	}
	s.addrs.Store(&m)
}

// Interfaces returns the addresses of the host's interfaces (in the
// network namespace of the calling thread).
func Interfaces() ([]netip.Addr, error) {
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("listing host addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range ifas {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr())
		}
	}
	return out, nil
}

// Watch returns a set of the host's addresses that follows the kernel's
// address changes until ctx ends or Close is called.
func Watch(ctx context.Context) (*Set, error) {
	return watch(ctx, Interfaces)
}

func watch(ctx context.Context, read func() ([]netip.Addr, error)) (*Set, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("opening netlink socket: %w", err)
	}
	sa := &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: unix.RTMGRP_IPV4_IFADDR | unix.RTMGRP_IPV6_IFADDR}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("subscribing to address changes: %w", err)
	}
	// Non-blocking: the runtime poller serves Read, and Close ends it.
	sock := os.NewFile(uintptr(fd), "netlink-addr")
	s := &Set{read: read, sock: sock, done: make(chan struct{})}
	if err := s.refresh(); err != nil {
		sock.Close()
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { s.Close() })
	go func() {
		defer close(s.done)
		defer stop()
		s.loop()
	}()
	return s, nil
}

func (s *Set) refresh() error {
	addrs, err := s.read()
	if err != nil {
		return err
	}
	s.store(addrs)
	return nil
}

// loop re-reads the addresses after every notification. Its buffer holds
// one datagram at a time: the messages' contents do not matter, only that
// something changed.
func (s *Set) loop() {
	buf := make([]byte, 64<<10)
	for {
		_, err := s.sock.Read(buf)
		if err != nil && !errors.Is(err, unix.ENOBUFS) {
			return // closed
		}
		// Changed, or changes were lost: read everything again. A failed
		// read keeps the last set until the next notification.
		_ = s.refresh()
	}
}

// Close stops a watching set; its addresses stay as they were. It is safe
// to call more than once and on a static set.
func (s *Set) Close() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	if s.closed || s.sock == nil {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	err := s.sock.Close()
	<-s.done
	return err
}
