package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fencesandbox/fence/internal/testutil"
)

// kubeVersion is the kube-apiserver scripts/build-kube.sh builds.
const kubeVersion = "v1.37.2"

// kubeBinaries returns kube-apiserver (built by scripts/build-kube.sh) and
// etcd (Debian's etcd-server). Missing ones skip the test, and fail it
// under CI, where scripts/test.sh builds them (build-kube.sh).
func kubeBinaries(t *testing.T) (apiserver, etcd string) {
	t.Helper()
	apiserver = os.Getenv("FENCE_KUBE_APISERVER")
	if apiserver == "" {
		root := cmpOr(os.Getenv("FENCE_KUBE_CACHE"), "/var/lib/fence/cache/kube")
		apiserver = filepath.Join(root, kubeVersion, "kube-apiserver")
	}
	etcd = os.Getenv("FENCE_ETCD")
	if etcd == "" {
		etcd, _ = exec.LookPath("etcd")
	}
	for _, p := range []string{apiserver, etcd} {
		if st, err := os.Stat(p); p == "" || err != nil || st.Mode()&0o111 == 0 {
			msg := fmt.Sprintf("kube-apiserver %q or etcd %q missing: run scripts/build-kube.sh", apiserver, etcd)
			if testutil.InCI() {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
	return apiserver, etcd
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// kubeEnv is a kube-apiserver and etcd run by one test, with static-token
// users: admin (system:masters), and the fence node and router service
// accounts' names, whose rights come only from deploy/rbac.yaml.
type kubeEnv struct {
	dir   string
	URL   string
	Admin kubernetes.Interface
	// Kubeconfig files by identity: "admin", "node", "router".
	Kubeconfig map[string]string
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startProc starts a helper process killed at cleanup, its output kept
// for the logs of a failed test.
func startProc(t *testing.T, name string, args ...string) *syncBuffer {
	t.Helper()
	out := &syncBuffer{}
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("%s output (tail):\n%s", filepath.Base(name), tail(out.String(), 4000))
		}
	})
	return out
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func startKube(t *testing.T) *kubeEnv {
	t.Helper()
	apiserver, etcd := kubeBinaries(t)
	dir := t.TempDir()
	k := &kubeEnv{dir: dir, Kubeconfig: map[string]string{}}

	etcdPort, peerPort := freePort(t), freePort(t)
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", etcdPort)
	startProc(t, etcd, "--data-dir", filepath.Join(dir, "etcd"), "--name", "fence-test",
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peerPort),
		"--initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peerPort),
		"--initial-cluster", fmt.Sprintf("fence-test=http://127.0.0.1:%d", peerPort))

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	saKey := write("sa.key", pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
	saPub := write("sa.pub", pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))
	tokens := map[string]string{"admin": randHex(16), "node": randHex(16), "router": randHex(16)}
	write("tokens.csv", []byte(fmt.Sprintf(
		"%s,admin,admin,system:masters\n"+
			"%s,system:serviceaccount:fence:fence-node,fence-node,system:serviceaccounts\n"+
			"%s,system:serviceaccount:fence:fence-router,fence-router,system:serviceaccounts\n",
		tokens["admin"], tokens["node"], tokens["router"])))
	port := freePort(t)
	k.URL = fmt.Sprintf("https://127.0.0.1:%d", port)
	out := startProc(t, apiserver,
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
		"--secure-port", fmt.Sprint(port),
		"--cert-dir", filepath.Join(dir, "certs"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", saPub,
		"--service-account-signing-key-file", saKey,
		"--service-cluster-ip-range", "10.0.0.0/24",
		"--enable-priority-and-fairness=false",
		// No Service endpoints to keep: a loopback address is refused by
		// the endpoint reconciler.
		"--endpoint-reconciler-type", "none",
	)
	for id, tok := range tokens {
		kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: %s, user: {token: %q}}]
contexts: [{name: test, context: {cluster: test, user: %s}}]
current-context: test
`, k.URL, id, tok, id)
		k.Kubeconfig[id] = write("kubeconfig-"+id, []byte(kc))
	}
	k.Admin = k.client(t, "admin")
	start := time.Now()
	eventually(t, 90*time.Second, "kube-apiserver ready", func() bool {
		b, err := k.Admin.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(context.Background())
		return err == nil && string(b) == "ok"
	})
	t.Logf("kube-apiserver ready in %v", time.Since(start).Round(time.Millisecond))
	_ = out
	return k
}

func (k *kubeEnv) client(t *testing.T, id string) kubernetes.Interface {
	t.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", k.Kubeconfig[id])
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// apply creates the objects of the YAML manifests (namespaces, service
// accounts and RBAC) as admin.
func (k *kubeEnv) apply(t *testing.T, files ...string) {
	t.Helper()
	ctx := ctxT(t)
	dec := scheme.Codecs.UniversalDeserializer()
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range bytes.Split(b, []byte("\n---")) {
			if len(bytes.TrimSpace(stripComments(doc))) == 0 {
				continue
			}
			obj, _, err := dec.Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if err := k.create(ctx, obj); err != nil {
				t.Fatalf("%s: creating %T: %v", f, obj, err)
			}
		}
	}
}

func stripComments(b []byte) []byte {
	var out []byte
	for _, l := range bytes.Split(b, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(l), []byte("#")) {
			out = append(out, l...)
			out = append(out, '\n')
		}
	}
	return out
}

func (k *kubeEnv) create(ctx context.Context, obj runtime.Object) error {
	c := metav1.CreateOptions{}
	var err error
	switch o := obj.(type) {
	case *corev1.Namespace:
		_, err = k.Admin.CoreV1().Namespaces().Create(ctx, o, c)
	case *corev1.ServiceAccount:
		_, err = k.Admin.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, c)
	case *rbacv1.Role:
		_, err = k.Admin.RbacV1().Roles(o.Namespace).Create(ctx, o, c)
	case *rbacv1.RoleBinding:
		_, err = k.Admin.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, c)
	default:
		err = fmt.Errorf("kind not handled by the test")
	}
	return err
}

// repoRoot returns the repository root (the integration dir's parent).
func repoRoot(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Dir(wd)
}

// httpGetStatus is a GET with headers, returning the status and body.
func httpDo(method, url string, body []byte, hdr map[string]string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var rd *bytes.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	var req *http.Request
	var err error
	if rd != nil {
		req, err = http.NewRequestWithContext(ctx, method, url, rd)
	} else {
		req, err = http.NewRequestWithContext(ctx, method, url, nil)
	}
	if err != nil {
		return 0, nil, err
	}
	for k, v := range hdr {
		if strings.EqualFold(k, "Host") {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, err = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes(), err
}

// startCluster starts the kube-apiserver harness with fence's namespace
// and RBAC applied, sets the cluster token every node and router of the
// test reads ($FENCE_CLUSTER_TOKEN), and returns the harness, that token
// and a fresh API key for the router.
func startCluster(t *testing.T) (k *kubeEnv, token, key string) {
	k = startKube(t)
	root := repoRoot(t)
	k.apply(t, filepath.Join(root, "deploy/namespace.yaml"), filepath.Join(root, "deploy/rbac.yaml"))
	token = randHex(32)
	t.Setenv("FENCE_CLUSTER_TOKEN", token)
	return k, token, "e2b_" + randHex(20)
}
