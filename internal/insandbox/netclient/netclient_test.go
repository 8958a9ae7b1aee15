package netclient

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"net"
	"testing"
)

// The client downloads what it asks a server on loopback for and reports
// its own CPU time during the download beside the throughput.
func TestMainReportsDownloadCPU(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				var hdr [8]byte
				if _, err := io.ReadFull(c, hdr[:]); err != nil {
					return
				}
				io.CopyN(c, zeros{}, int64(binary.BigEndian.Uint64(hdr[:])))
			}()
		}
	}()
	var out bytes.Buffer
	if err := Main([]string{"--addr", ln.Addr().String(), "--bytes", "67108864", "--connects", "2"}, &out); err != nil {
		t.Fatal(err)
	}
	var r Result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	if r.Bytes != 64<<20 || r.BytesPerSec <= 0 || r.Connects != 2 || r.DownloadCPUSec <= 0 {
		t.Fatalf("result %+v", r)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
