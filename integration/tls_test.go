package integration

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fencesandbox/fence/api"
)

// TestTLS proves that `fence serve --tls-cert --tls-key` serves the API and
// the sandbox traffic over HTTPS with HTTP/2, as a production deployment
// with a wildcard certificate would. Root: the daemon creates sandboxes.
func TestTLS(t *testing.T) {
	dir := newDataDir(t)
	cert, key := writeSelfSigned(t, filepath.Join(dir, ".."))
	d := startDaemon(t, dir, "--tls-cert", cert, "--tls-key", key)
	if d.URL[:8] != "https://" {
		t.Fatalf("daemon URL %q, want https", d.URL)
	}
	resp, err := httpClientFor(d.URL).Get(d.URL + "/health")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.ProtoMajor != 2 {
		t.Errorf("GET /health over TLS used %s, want HTTP/2", resp.Proto)
	}
	sb := d.create(t, api.NewSandbox{TemplateID: "minimal"})
	if out := sh(t, sb.Envd(), "echo over-tls"); out != "over-tls\n" {
		t.Errorf("a command through the HTTPS proxy printed %q", out)
	}
	// A client that does not trust the certificate is refused.
	if _, err := http.Get(d.URL + "/health"); err == nil {
		t.Error("a client with the system trust store accepted the self-signed certificate")
	}
}

// writeSelfSigned writes a certificate for localhost and *.localhost.
func writeSelfSigned(t *testing.T, dir string) (certPath, keyPath string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost", "*.localhost"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath = filepath.Join(dir, "tls-cert.pem"), filepath.Join(dir, "tls-key.pem")
	os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
	os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600)
	return certPath, keyPath
}
