package gateway

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestCACreateAndReload(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "gw")
	ca, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]os.FileMode{dir: 0o700 | os.ModeDir, filepath.Join(dir, CACertFile): 0o644, filepath.Join(dir, CAKeyFile): 0o600} {
		st, err := os.Stat(name)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode() != want {
			t.Errorf("%s: mode %v, want %v", name, st.Mode(), want)
		}
	}
	cert := ca.Certificate()
	if !cert.IsCA || !cert.MaxPathLenZero || cert.PublicKeyAlgorithm != x509.ECDSA {
		t.Errorf("CA certificate: IsCA %v MaxPathLenZero %v alg %v", cert.IsCA, cert.MaxPathLenZero, cert.PublicKeyAlgorithm)
	}
	if pub := cert.PublicKey.(*ecdsa.PublicKey); pub.Curve != elliptic.P256() {
		t.Errorf("curve %v", pub.Curve.Params().Name)
	}
	again, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.CertPEM(), ca.CertPEM()) {
		t.Fatal("reload made a new CA")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("dir holds %d entries (temporary files left?)", len(entries))
	}
}

func TestCARefusesBadKeyFiles(t *testing.T) {
	t.Run("group-readable", func(t *testing.T) {
		dir := t.TempDir()
		if _, err := LoadOrCreateCA(dir); err != nil {
			t.Fatal(err)
		}
		os.Chmod(filepath.Join(dir, CAKeyFile), 0o640)
		if _, err := LoadOrCreateCA(dir); err == nil || !strings.Contains(err.Error(), "0640") {
			t.Fatalf("err %v", err)
		}
	})
	t.Run("symlink", func(t *testing.T) {
		dir, other := t.TempDir(), t.TempDir()
		if _, err := LoadOrCreateCA(other); err != nil {
			t.Fatal(err)
		}
		os.Symlink(filepath.Join(other, CAKeyFile), filepath.Join(dir, CAKeyFile))
		data, _ := os.ReadFile(filepath.Join(other, CACertFile))
		os.WriteFile(filepath.Join(dir, CACertFile), data, 0o644)
		if _, err := LoadOrCreateCA(dir); err == nil {
			t.Fatal("a symlinked key was accepted")
		}
	})
	t.Run("mismatch", func(t *testing.T) {
		a, b := t.TempDir(), t.TempDir()
		LoadOrCreateCA(a)
		LoadOrCreateCA(b)
		data, _ := os.ReadFile(filepath.Join(b, CAKeyFile))
		os.WriteFile(filepath.Join(a, CAKeyFile), data, 0o600)
		before, _ := os.ReadFile(filepath.Join(a, CACertFile))
		if _, err := LoadOrCreateCA(a); err == nil || !strings.Contains(err.Error(), "does not match") {
			t.Fatalf("err %v", err)
		}
		after, _ := os.ReadFile(filepath.Join(a, CACertFile))
		if !bytes.Equal(before, after) {
			t.Fatal("a refused load changed the certificate")
		}
	})
	t.Run("cert-without-key", func(t *testing.T) {
		dir := t.TempDir()
		LoadOrCreateCA(dir)
		os.Remove(filepath.Join(dir, CAKeyFile))
		if _, err := LoadOrCreateCA(dir); err == nil {
			t.Fatal("a certificate without its key was accepted")
		}
		if _, err := os.Stat(filepath.Join(dir, CAKeyFile)); err == nil {
			t.Fatal("a new key was written next to the old certificate")
		}
	})
}

func TestCAKeyWithoutCertGetsCert(t *testing.T) {
	dir := t.TempDir()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.MarshalPKCS8PrivateKey(key)
	os.WriteFile(filepath.Join(dir, CAKeyFile), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
	ca, err := LoadOrCreateCA(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !ca.Certificate().PublicKey.(*ecdsa.PublicKey).Equal(&key.PublicKey) {
		t.Fatal("the certificate is not for the existing key")
	}
}

func TestLeaf(t *testing.T) {
	ca := newCAForTest(t)
	now := time.Now()
	leaf, err := ca.Leaf("API.Example.com.")
	if err != nil {
		t.Fatal(err)
	}
	c := leaf.Leaf
	if len(c.DNSNames) != 1 || c.DNSNames[0] != "api.example.com" || len(c.IPAddresses) != 0 {
		t.Errorf("SANs %v %v", c.DNSNames, c.IPAddresses)
	}
	if c.NotBefore.After(now.Add(-59*time.Minute)) || c.NotAfter.After(now.Add(7*24*time.Hour+time.Minute)) || c.NotAfter.Before(now.Add(6*24*time.Hour)) {
		t.Errorf("validity %v – %v", c.NotBefore, c.NotAfter)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Certificate())
	if _, err := c.Verify(x509.VerifyOptions{DNSName: "api.example.com", Roots: pool}); err != nil {
		t.Errorf("verify: %v", err)
	}
	if _, err := c.Verify(x509.VerifyOptions{DNSName: "other.example.com", Roots: pool}); err == nil {
		t.Error("leaf verifies for another name")
	}
	again, _ := ca.Leaf("api.example.com")
	if again != leaf {
		t.Error("leaf not cached")
	}
	if _, err := ca.Leaf("bad name"); err == nil {
		t.Error("leaf for an invalid name")
	}
}

func TestLeafSingleFlightAndBound(t *testing.T) {
	ca := newCAForTest(t)
	ca.maxLeafs = 8
	var wg sync.WaitGroup
	got := make([]any, 32)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := ca.Leaf("same.example")
			if err != nil {
				t.Error(err)
			}
			got[i] = l
		}()
	}
	wg.Wait()
	for _, g := range got {
		if g != got[0] {
			t.Fatal("concurrent calls signed more than one leaf")
		}
	}
	for i := 0; i < 20; i++ {
		ca.Leaf(strings.Repeat("a", i+1) + ".example")
	}
	ca.mu.Lock()
	n, m := ca.lru.Len(), len(ca.leaves)
	ca.mu.Unlock()
	if n != 8 || m != 8 {
		t.Fatalf("cache holds %d/%d leaves, bound 8", n, m)
	}
	// A leaf near expiry is made again.
	l1, _ := ca.Leaf("renew.example")
	ca.now = func() time.Time { return time.Now().Add(6*24*time.Hour + 12*time.Hour) }
	l2, _ := ca.Leaf("renew.example")
	if l1 == l2 {
		t.Fatal("a leaf within a day of expiry was served from the cache")
	}
}
