// Package netclient is the client of fence bench's network measure, the
// hidden `fence bench-client` role. It runs inside a sandbox (and on the
// host, for the comparison), so it links little: the in-sandbox binary
// carries it.
package netclient

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"slices"
	"syscall"
	"time"
)

// Result is what the client measures, printed as JSON.
type Result struct {
	Bytes         int64   `json:"bytes"`
	BytesPerSec   float64 `json:"bytesPerSec"`
	ConnectP50Sec float64 `json:"connectP50Sec"`
	Connects      int     `json:"connects"`
	// DNSFirstSec is the first lookup of --dns (a cache miss upstream of a
	// sandbox); DNSP50Sec the median of the lookups after it (answered
	// from the daemon's cache in a sandbox).
	DNSFirstSec float64 `json:"dnsFirstSec,omitempty"`
	DNSP50Sec   float64 `json:"dnsP50Sec,omitempty"`
	// DownloadCPUSec is the client's own CPU time (user and system)
	// during the download.
	DownloadCPUSec float64 `json:"downloadCPUSec"`
}

// Main is the hidden `fence bench-client` role: from wherever it runs (a
// sandbox, or the host), download --bytes from --addr once, then open
// --connects connections one after another, each asking for one byte, and
// print a NetResult.
func Main(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench-client", flag.ContinueOnError)
	addr := fs.String("addr", "", "server address host:port")
	size := fs.Int64("bytes", 256<<20, "bytes to download")
	connects := fs.Int("connects", 50, "connections to time")
	dnsName := fs.String("dns", "", "name to resolve (A) --lookups times")
	dnsServer := fs.String("dns-server", "", "DNS server ip:port (default: the system's resolver)")
	lookups := fs.Int("lookups", 50, "lookups of --dns to time after the first")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var r Result
	cpu0 := cpuTime()
	start := time.Now()
	got, err := ask(*addr, *size)
	if err != nil {
		return fmt.Errorf("download: %w", err)
	}
	r.Bytes, r.BytesPerSec = got, float64(got)/time.Since(start).Seconds()
	r.DownloadCPUSec = (cpuTime() - cpu0).Seconds()
	var lat []time.Duration
	for range *connects {
		t := time.Now()
		if _, err := ask(*addr, 1); err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		lat = append(lat, time.Since(t))
	}
	if len(lat) > 0 {
		r.ConnectP50Sec, r.Connects = median(lat).Seconds(), len(lat)
	}
	if *dnsName != "" {
		if err := timeLookups(&r, *dnsName, *dnsServer, *lookups); err != nil {
			return err
		}
	}
	return json.NewEncoder(out).Encode(r)
}

// cpuTime is the process's CPU time so far, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ask connects to the server at addr, asks it for n bytes and reads them
// to the end, giving how many came.
func ask(addr string, n int64) (int64, error) {
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	var hdr [8]byte
	binary.BigEndian.PutUint64(hdr[:], uint64(n))
	if _, err := c.Write(hdr[:]); err != nil {
		return 0, err
	}
	buf := make([]byte, 256<<10)
	var got int64
	for {
		k, err := c.Read(buf)
		got += int64(k)
		if err == io.EOF {
			return got, nil
		}
		if err != nil {
			return got, err
		}
	}
}

// timeLookups resolves name (A) once and then lookups times more, through
// server when it is set (else the system's resolver), and records the
// first lookup's time and the median of the others in r.
func timeLookups(r *Result, name, server string, lookups int) error {
	res := &net.Resolver{PreferGo: true}
	if server != "" {
		res.Dial = func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, server)
		}
	}
	var dl []time.Duration
	for i := -1; i < lookups; i++ {
		t := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := res.LookupNetIP(ctx, "ip4", name)
		cancel()
		if err != nil {
			return fmt.Errorf("resolving %s: %w", name, err)
		}
		if i < 0 {
			r.DNSFirstSec = time.Since(t).Seconds()
		} else {
			dl = append(dl, time.Since(t))
		}
	}
	if len(dl) > 0 {
		r.DNSP50Sec = median(dl).Seconds()
	}
	return nil
}

// median sorts d (not empty) and gives its middle value.
func median(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}
