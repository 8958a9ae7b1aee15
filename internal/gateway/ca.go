package gateway

import (
	"bytes"
	"container/list"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fencesandbox/fence/internal/egress/policy"
	"github.com/fencesandbox/fence/internal/keyfile"
)

// CA file names inside the directory given to [LoadOrCreateCA].
const (
	CACertFile = "ca.pem"
	CAKeyFile  = "ca-key.pem"
)

const (
	caValidity    = 10 * 365 * 24 * time.Hour
	leafValidity  = 7 * 24 * time.Hour
	leafBackdate  = time.Hour
	leafRenewal   = 24 * time.Hour // a cached leaf this close to expiry is made again
	leafCacheSize = 4096
	maxPEMFile    = 64 << 10
)

// CA is the gateway's certificate authority: it signs a short-lived leaf
// certificate for every name the gateway terminates TLS for. It is safe
// for concurrent use.
type CA struct {
	cert    *x509.Certificate
	certPEM []byte
	key     *ecdsa.PrivateKey

	now func() time.Time

	mu       sync.Mutex
	leaves   map[string]*list.Element // name → element holding *leafEntry
	lru      *list.List               // front = most recently used
	inflight map[string]*leafCall
	maxLeafs int
}

type leafEntry struct {
	name string
	cert *tls.Certificate
	exp  time.Time
}

type leafCall struct {
	done chan struct{}
	cert *tls.Certificate
	err  error
}

// LoadOrCreateCA loads the CA from dir (ca.pem and ca-key.pem), or makes
// a new ECDSA P-256 CA there when neither file exists. dir is made 0700
// when missing; the key is written 0600 and atomically (temporary file,
// fsync, rename), the certificate 0644. A key file that is not a regular
// file, is readable or writable by group or others, or does not match the
// certificate is refused. A key without a certificate (a crash between
// the two writes) gets a new certificate; a certificate without its key
// is an error.
func LoadOrCreateCA(dir string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("gateway CA: making %s: %w", dir, err)
	}
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	keyPEM, keyErr := keyfile.ReadPrivate(keyPath, maxPEMFile)
	certPEM, certErr := keyfile.ReadNoFollow(certPath, maxPEMFile)
	switch {
	case keyErr != nil && !errors.Is(keyErr, fs.ErrNotExist):
		return nil, fmt.Errorf("gateway CA: %w", keyErr)
	case certErr != nil && !errors.Is(certErr, fs.ErrNotExist):
		return nil, fmt.Errorf("gateway CA: %w", certErr)
	case keyErr == nil && certErr == nil:
		return parseCA(certPEM, keyPEM)
	case certErr == nil: // certificate without key
		return nil, fmt.Errorf("gateway CA: %s exists but %s does not; remove %s to make a new CA", certPath, keyPath, certPath)
	}

	var key *ecdsa.PrivateKey
	if keyErr == nil { // key without certificate: finish the interrupted creation
		k, err := parseKey(keyPEM)
		if err != nil {
			return nil, fmt.Errorf("gateway CA: %s: %w", keyPath, err)
		}
		key = k
	} else {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("gateway CA: generating key: %w", err)
		}
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			return nil, fmt.Errorf("gateway CA: encoding key: %w", err)
		}
		if err := keyfile.WriteAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
			return nil, fmt.Errorf("gateway CA: %w", err)
		}
		key = k
	}
	cert, err := selfSign(key, time.Now())
	if err != nil {
		return nil, fmt.Errorf("gateway CA: %w", err)
	}
	certPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw})
	if err := keyfile.WriteAtomic(certPath, certPEM, 0o644); err != nil {
		return nil, fmt.Errorf("gateway CA: %w", err)
	}
	return newCA(cert, certPEM, key), nil
}

func newCA(cert *x509.Certificate, certPEM []byte, key *ecdsa.PrivateKey) *CA {
	return &CA{
		cert: cert, certPEM: certPEM, key: key, now: time.Now,
		leaves: map[string]*list.Element{}, lru: list.New(),
		inflight: map[string]*leafCall{}, maxLeafs: leafCacheSize,
	}
}

func selfSign(key *ecdsa.PrivateKey, now time.Time) (*x509.Certificate, error) {
	serial, err := randSerial()
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject: pkix.Name{
			CommonName:   "fence egress gateway CA " + serial.Text(16)[:8],
			Organization: []string{"fence"},
		},
		NotBefore:             now.Add(-leafBackdate),
		NotAfter:              now.Add(caValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLen:            0,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("signing CA certificate: %w", err)
	}
	return x509.ParseCertificate(der)
}

func parseCA(certPEM, keyPEM []byte) (*CA, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, errors.New("gateway CA: ca.pem holds no certificate")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("gateway CA: parsing ca.pem: %w", err)
	}
	if !cert.IsCA || cert.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, errors.New("gateway CA: ca.pem is not a CA certificate")
	}
	if time.Now().After(cert.NotAfter) {
		return nil, fmt.Errorf("gateway CA: ca.pem expired on %s; remove ca.pem and ca-key.pem to make a new CA", cert.NotAfter.Format(time.DateOnly))
	}
	key, err := parseKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("gateway CA: ca-key.pem: %w", err)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(key.Public()) {
		return nil, errors.New("gateway CA: ca-key.pem does not match ca.pem")
	}
	return newCA(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Raw}), key), nil
}

func parseKey(keyPEM []byte) (*ecdsa.PrivateKey, error) {
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	switch block.Type {
	case "PRIVATE KEY":
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing key: %w", err)
		}
		ek, ok := k.(*ecdsa.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("key is %T, want ECDSA", k)
		}
		return ek, nil
	case "EC PRIVATE KEY":
		k, err := x509.ParseECPrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parsing key: %w", err)
		}
		return k, nil
	}
	return nil, fmt.Errorf("unexpected PEM block %q", block.Type)
}

func randSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return s.Add(s, big.NewInt(1)), nil
}

// CertPEM returns the CA certificate in PEM, the bundle sandboxes trust.
func (ca *CA) CertPEM() []byte { return bytes.Clone(ca.certPEM) }

// Certificate returns the parsed CA certificate.
func (ca *CA) Certificate() *x509.Certificate { return ca.cert }

// Leaf returns a certificate for name (a DNS name; its only SAN), valid
// for 7 days from an hour ago and never past the CA's own expiry. Leaves
// are cached (at most 4096, least recently used evicted, remade a day
// before they expire); concurrent calls for one name sign once.
func (ca *CA) Leaf(name string) (*tls.Certificate, error) {
	n, ok := policy.NormalizeName(name)
	if !ok {
		return nil, fmt.Errorf("gateway CA: %q is not a DNS name", name)
	}
	now := ca.now()
	ca.mu.Lock()
	if el, ok := ca.leaves[n]; ok {
		e := el.Value.(*leafEntry)
		if now.Add(leafRenewal).Before(e.exp) {
			ca.lru.MoveToFront(el)
			ca.mu.Unlock()
			return e.cert, nil
		}
	}
	if c, ok := ca.inflight[n]; ok {
		ca.mu.Unlock()
		<-c.done
		return c.cert, c.err
	}
	c := &leafCall{done: make(chan struct{})}
	ca.inflight[n] = c
	ca.mu.Unlock()

	c.cert, c.err = ca.sign(n, now)

	ca.mu.Lock()
	delete(ca.inflight, n)
	if c.err == nil {
		if el, ok := ca.leaves[n]; ok {
			el.Value = &leafEntry{name: n, cert: c.cert, exp: c.cert.Leaf.NotAfter}
			ca.lru.MoveToFront(el)
		} else {
			ca.leaves[n] = ca.lru.PushFront(&leafEntry{name: n, cert: c.cert, exp: c.cert.Leaf.NotAfter})
			for ca.lru.Len() > ca.maxLeafs {
				old := ca.lru.Back()
				ca.lru.Remove(old)
				delete(ca.leaves, old.Value.(*leafEntry).name)
			}
		}
	}
	ca.mu.Unlock()
	close(c.done)
	return c.cert, c.err
}

func (ca *CA) sign(name string, now time.Time) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("gateway CA: leaf key: %w", err)
	}
	serial, err := randSerial()
	if err != nil {
		return nil, fmt.Errorf("gateway CA: %w", err)
	}
	notAfter := now.Add(leafValidity)
	if notAfter.After(ca.cert.NotAfter) {
		notAfter = ca.cert.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: name},
		DNSNames:     []string{name},
		NotBefore:    now.Add(-leafBackdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return nil, fmt.Errorf("gateway CA: signing leaf for %s: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("gateway CA: parsing leaf: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}
