package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fencesandbox/fence/internal/egress/policy"
)

// Reasons an [Event] gives for a refused request.
const (
	ReasonBadHost         = "bad-host"           // no Host, or not a name or address
	ReasonHostMismatch    = "host-mismatch"      // Host/:authority is not the TLS server name
	ReasonPolicy          = "policy"             // the sandbox's policy denies the host ("policy:" + the policy's reason)
	ReasonIPLiteral       = "ip-literal-host"    // plain HTTP to an address on a flow admitted by name
	ReasonMethod          = "method-not-allowed" // CONNECT
	ReasonNoConfig        = "no-config"          // the sandbox has no configuration (any more)
	ReasonPlaceholderLeak = "placeholder-leak"   // a placeholder outside its binding's hosts and places
	ReasonSecretMissing   = "secret-missing"     // a rule or binding names a secret the store does not give
	ReasonSecretPlainHTTP = "secret-over-plain-http"
	ReasonUpstreamTLS     = "upstream-tls"         // upstream failed verification: no request was sent
	ReasonUpstream        = "upstream-error"       // upstream unreachable or failed mid-request
	ReasonEncoding        = "unscannable-encoding" // a masked response came in an encoding the gateway cannot read
	ReasonAborted         = "aborted"              // the response was cut short
	ReasonUpgrade         = "upgrade-not-allowed"  // an Upgrade other than websocket (h2c would hide requests from the gateway)
	ReasonPartial         = "partial-content"      // a 206 or multipart/byteranges answer where answers are masked
)

// reqState is what the gateway knows about one request while it is proxied.
type reqState struct {
	ev       Event
	host     string
	rawQuery string // the query to send (placeholders replaced)
	hdrRepl  []needle
	basic    []needle
	rules    map[string]string
	masks    []needle // injected value → what the sandbox sees instead
	bodyScan []needle
	leak     atomic.Pointer[string] // secret whose placeholder the body carried
	outBody  *countReader
	inBody   *countReader
	dl       *artifactHit
	encErr   bool
	partial  bool
}

type artifactHit struct {
	artifact
	url  string
	body *countReader
}

type stateKey struct{}

func (fc *flowConn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !fc.enter() {
		http.Error(w, "connection closing", http.StatusServiceUnavailable)
		return
	}
	defer fc.leave()
	st := &reqState{ev: Event{
		SandboxID: fc.sb.id, Time: time.Now(), Host: r.Host, Method: r.Method, Path: r.URL.Path,
	}}
	completed := false
	defer func() {
		if st.outBody != nil {
			st.ev.BytesOut = st.outBody.n.Load()
		}
		if st.inBody != nil {
			st.ev.BytesIn = st.inBody.n.Load()
		}
		if s := st.leak.Load(); s != nil {
			st.ev.Reason = ReasonPlaceholderLeak
			st.ev.Secrets = []string{*s}
		} else if !completed && st.ev.Reason == "" {
			st.ev.Reason = ReasonAborted
		}
		st.ev.Allowed = st.ev.Reason == ""
		fc.sb.request(r.Context(), st.ev)
		if completed && st.dl != nil && st.dl.body.done.Load() && st.ev.Allowed {
			fc.sb.download(r.Context(), Download{
				SandboxID: fc.sb.id, Time: time.Now(), Ecosystem: st.dl.Ecosystem,
				Name: st.dl.Name, Version: st.dl.Version, URL: st.dl.url,
				Size: st.dl.body.n.Load(), SHA256: hex.EncodeToString(st.dl.body.h.Sum(nil)),
			})
		}
	}()
	if status := fc.decide(r, st); status != 0 {
		refuse(w, status, st.ev.Reason)
		completed = true
		return
	}
	// An upstream may answer before the request body's end (a stream):
	// without full duplex net/http would discard the rest of the body
	// under the transport, which then drops the upstream connection.
	_ = http.NewResponseController(w).EnableFullDuplex()
	fc.proxy.ServeHTTP(interimMasker{w, st}, r.WithContext(context.WithValue(r.Context(), stateKey{}, st)))
	completed = true
}

func refuse(w http.ResponseWriter, status int, reason string) {
	w.Header().Set("X-Fence-Gateway", reason)
	http.Error(w, "fence gateway: "+reason, status)
}

// decide checks a request and plans what to put into it; a non-zero
// status refuses it (st.ev says why). The checks run in this order: the
// sandbox's configuration, the request's host, method and flow, every
// binding's placeholder, then the header rules.
func (fc *flowConn) decide(r *http.Request, st *reqState) int {
	cfg := fc.sb.cfg()
	if cfg == nil || cfg.Policy == nil {
		return st.fail(http.StatusForbidden, ReasonNoConfig)
	}
	if status := fc.admit(r, cfg.Policy, st); status != 0 {
		return status
	}
	tlsFlow := fc.sni != ""

	// Bindings: find every placeholder, replace those in allowed places of
	// bound hosts, refuse the others.
	st.rawQuery = r.URL.RawQuery
	used, status := fc.scanBindings(r, cfg.Bindings, st)
	if status != 0 {
		return status
	}
	if status := fc.putBindings(r.Context(), used, tlsFlow, st); status != 0 {
		return status
	}
	return fc.planRules(r.Context(), cfg.Rules, tlsFlow, st)
}

// fail records why a request is refused and gives its status.
func (st *reqState) fail(status int, reason string, secrets ...string) int {
	st.ev.Reason, st.ev.Secrets = reason, secrets
	return status
}

// admit checks the request's host (Host, else the TLS server name), its
// method and Upgrade, that the host is the flow's server name, and that
// the policy allows the host; it sets st.host.
func (fc *flowConn) admit(r *http.Request, pol *policy.Policy, st *reqState) int {
	hostport := r.Host
	if hostport == "" && fc.sni != "" {
		hostport = fc.sni
	}
	host, isIP, ok := splitHost(hostport)
	if !ok {
		return st.fail(http.StatusBadRequest, ReasonBadHost)
	}
	st.host, st.ev.Host = host, host
	if r.Method == http.MethodConnect {
		return st.fail(http.StatusMethodNotAllowed, ReasonMethod)
	}
	if up := r.Header.Get("Upgrade"); up != "" && !strings.EqualFold(strings.TrimSpace(up), "websocket") {
		return st.fail(http.StatusForbidden, ReasonUpgrade)
	}
	tlsFlow := fc.sni != ""
	if tlsFlow && host != fc.sni {
		return st.fail(http.StatusMisdirectedRequest, ReasonHostMismatch)
	}
	d := pol.Decide(policy.Flow{Proto: policy.TCP, Dst: fc.flow.Dst, Names: fc.flow.Names, Observed: host})
	if !d.Allow {
		return st.fail(http.StatusForbidden, ReasonPolicy+":"+d.Reason)
	}
	if isIP && d.Reason == policy.ReasonAllowName {
		return st.fail(http.StatusForbidden, ReasonIPLiteral)
	}
	return 0
}

// usedBinding is a binding whose placeholder a request carries, and where.
type usedBinding struct {
	Binding
	places Place
}

// scanBindings finds each binding's placeholder in the request: it
// refuses one outside its binding's hosts and places, gives back the
// bindings to put in, masks the values of those the host was named for
// but that this request does not carry, and has the body scanned for
// every placeholder.
func (fc *flowConn) scanBindings(r *http.Request, bindings []Binding, st *reqState) ([]usedBinding, int) {
	defPort := uint16(80)
	if fc.sni != "" {
		defPort = 443
	}
	var used []usedBinding
	for _, b := range bindings {
		if b.Placeholder == "" {
			continue
		}
		// bound: this request's host and port may carry the value;
		// named: the host (on any port, in either scheme) may have been
		// given it, so what it answers is masked.
		bound := boundTo(b.Hosts, st.host, fc.flow.Dst.Port(), defPort)
		named := boundName(b.Hosts, st.host)
		places, leak := placesOf(r, b, bound)
		if leak {
			return nil, st.fail(http.StatusForbidden, ReasonPlaceholderLeak, b.Secret)
		}
		if places != 0 {
			used = append(used, usedBinding{b, places})
		} else if named {
			// Not put in this time, but the host may hand back a value
			// it kept from an earlier request (on another port, or over
			// plain HTTP): mask it all the same.
			if v, err := fc.sb.secret(r.Context(), b.Secret); err == nil {
				st.masks = append(st.masks, maskOf(v, b.Placeholder)...)
				st.masks = append(st.masks, maskOf(url.QueryEscape(v), url.QueryEscape(b.Placeholder))...)
			}
		}
		st.bodyScan = append(st.bodyScan, needle{find: []byte(b.Placeholder), secret: b.Secret})
	}
	return used, 0
}

// placesOf reports where the request carries b's placeholder, or leak when
// it carries it in its path, in a header's name, or in a place that b does
// not allow or on a host and port b is not bound to (bound false).
func placesOf(r *http.Request, b Binding, bound bool) (places Place, leak bool) {
	p := b.Placeholder
	if strings.Contains(r.URL.EscapedPath(), p) || strings.Contains(r.URL.Path, p) || strings.Contains(r.RequestURI, p) && !strings.Contains(r.URL.RawQuery, p) {
		return 0, true
	}
	if found, leak := scanQuery(r.URL.RawQuery, p, bound && b.Places&PlaceQuery != 0); leak {
		return 0, true
	} else if found {
		places |= PlaceQuery
	}
	for k, vs := range r.Header {
		if strings.Contains(k, p) {
			return 0, true
		}
		for _, v := range vs {
			if strings.Contains(v, p) {
				if !bound || b.Places&PlaceHeader == 0 {
					return 0, true
				}
				places |= PlaceHeader
			}
			if k == "Authorization" || k == "Proxy-Authorization" {
				if cred, ok := basicCred(v); ok && strings.Contains(cred, p) {
					if !bound || b.Places&PlaceBasicAuth == 0 || k != "Authorization" {
						return 0, true
					}
					places |= PlaceBasicAuth
				}
			}
		}
	}
	return places, false
}

// putBindings plans the values of the used bindings into their places
// and masks them in what comes back; it refuses them over plain HTTP and
// when the store does not give a secret.
func (fc *flowConn) putBindings(ctx context.Context, used []usedBinding, tlsFlow bool, st *reqState) int {
	if len(used) > 0 && !tlsFlow {
		names := make([]string, len(used))
		for i, b := range used {
			names[i] = b.Secret
		}
		return st.fail(http.StatusForbidden, ReasonSecretPlainHTTP, names...)
	}
	for _, b := range used {
		v, err := fc.sb.secret(ctx, b.Secret)
		if err != nil {
			return st.fail(http.StatusBadGateway, ReasonSecretMissing, b.Secret)
		}
		st.ev.Secrets = appendUnique(st.ev.Secrets, b.Secret)
		nd := needle{find: []byte(b.Placeholder), replace: []byte(v)}
		if b.places&PlaceHeader != 0 {
			st.hdrRepl = append(st.hdrRepl, nd)
		}
		if b.places&PlaceBasicAuth != 0 {
			st.basic = append(st.basic, nd)
		}
		if b.places&PlaceQuery != 0 {
			st.rawQuery = replaceQuery(st.rawQuery, b.Placeholder, v)
			st.masks = append(st.masks, maskOf(url.QueryEscape(v), url.QueryEscape(b.Placeholder))...)
		}
		st.masks = append(st.masks, maskOf(v, b.Placeholder)...)
	}
	return 0
}

// planRules fills in the header rules for the request's host (all but
// Host), with their secrets put in and masked in what comes back; it
// refuses a rule with secrets over plain HTTP and one whose secret the
// store does not give.
func (fc *flowConn) planRules(ctx context.Context, rules map[string]map[string]string, tlsFlow bool, st *reqState) int {
	rs := ruleFor(rules, st.host)
	if rs == nil {
		return 0
	}
	st.rules = make(map[string]string, len(rs))
	for name, tmpl := range rs {
		if http.CanonicalHeaderKey(name) == "Host" {
			continue
		}
		refs := secretRefs(tmpl)
		if len(refs) > 0 && !tlsFlow {
			return st.fail(http.StatusForbidden, ReasonSecretPlainHTTP, refs...)
		}
		val := tmpl
		for _, ref := range refs {
			v, err := fc.sb.secret(ctx, ref)
			if err != nil {
				return st.fail(http.StatusBadGateway, ReasonSecretMissing, ref)
			}
			val = strings.ReplaceAll(val, secretRef(ref), v)
			st.ev.Secrets = appendUnique(st.ev.Secrets, ref)
			st.masks = append(st.masks, maskOf(v, secretRef(ref))...)
		}
		st.rules[http.CanonicalHeaderKey(name)] = val
	}
	return 0
}

// rewrite builds the upstream request: same method, path and Host, sent
// to the flow's destination, with the planned values put in.
func (fc *flowConn) rewrite(pr *httputil.ProxyRequest) {
	st := pr.In.Context().Value(stateKey{}).(*reqState)
	out := pr.Out
	if fc.sni != "" {
		out.URL.Scheme = "https"
	} else {
		out.URL.Scheme = "http"
	}
	out.URL.Host = fc.target
	out.Host = pr.In.Host
	if out.Host == "" {
		out.Host = st.host
	}
	out.URL.RawQuery = st.rawQuery
	out.Trailer = nil
	if len(st.hdrRepl) > 0 {
		for k, vs := range out.Header {
			for i, v := range vs {
				vs[i] = replaceAll(v, st.hdrRepl)
			}
			out.Header[k] = vs
		}
	}
	if len(st.basic) > 0 {
		if v := out.Header.Get("Authorization"); v != "" {
			if cred, ok := basicCred(v); ok {
				real := replaceAll(cred, st.basic)
				enc := base64.StdEncoding.EncodeToString([]byte(real))
				out.Header.Set("Authorization", "Basic "+enc)
				st.masks = append(st.masks, maskOf(enc, base64.StdEncoding.EncodeToString([]byte(cred)))...)
			}
		}
	}
	for k, v := range st.rules {
		out.Header[k] = []string{v}
	}
	if len(st.masks) > 0 {
		// The sandbox must not choose how the answer is cut or coded:
		// no ranges (a value split over two answers, or across a
		// multipart boundary, is masked in neither), no coding the
		// gateway does not undo, no digest of the unmasked body (a
		// check of guesses). The proxy already drops TE but "trailers".
		out.Header.Set("Accept-Encoding", "identity")
		for _, k := range cutRequestHeaders {
			out.Header.Del(k)
		}
	}
	if out.Body != nil && out.Body != http.NoBody {
		body := out.Body
		if len(st.bodyScan) > 0 {
			body = newLeakReader(body, st.bodyScan, func(secret string) { st.leak.Store(&secret) })
		}
		st.outBody = newCountReader(body, false)
		out.Body = st.outBody
	}
}

var (
	errEncoding = errors.New("gateway: response encoding cannot be scanned")
	errPartial  = errors.New("gateway: partial content from a host whose answers are masked")
)

// modifyResponse masks injected values in what comes back, records
// downloads and counts the body.
func (fc *flowConn) modifyResponse(resp *http.Response) error {
	st := resp.Request.Context().Value(stateKey{}).(*reqState)
	st.ev.Status = resp.StatusCode
	if st.leak.Load() != nil {
		return errPlaceholderLeak
	}
	if resp.StatusCode == http.StatusSwitchingProtocols {
		maskFields(resp.Header, st.masks)
		return nil
	}
	if len(st.masks) > 0 {
		if resp.StatusCode == http.StatusPartialContent || isByteranges(resp.Header) {
			st.partial = true
			return errPartial
		}
		maskFields(resp.Header, st.masks)
		maskFields(resp.Trailer, st.masks) // the names the proxy announces
		for _, k := range digestHeaders {
			resp.Header.Del(k)
			resp.Trailer.Del(k)
		}
		body, err := decoded(resp)
		if err != nil {
			st.encErr = true
			return err
		}
		// resp.Trailer, not a copy: an HTTP/1.1 transport makes the map
		// at the body's end when the upstream announced none.
		resp.Body = newReplaceReader(body, st.masks, func() {
			maskFields(resp.Trailer, st.masks)
			for _, k := range digestHeaders {
				resp.Trailer.Del(k)
			}
		})
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
	}
	req := resp.Request
	if req.Method == http.MethodGet {
		switch {
		case resp.StatusCode == http.StatusOK:
			a, ok := artifactOf(st.host, req.URL.EscapedPath())
			where := artifactURL(req.URL.Scheme, st.host, req.URL)
			if !ok {
				a, where, ok = fc.sb.redirects.take(requestKey(fc.sni != "", st.host, req.URL))
			}
			if ok {
				body := newCountReader(resp.Body, true)
				resp.Body = body
				st.dl = &artifactHit{artifact: a, url: where, body: body}
			}
		case resp.StatusCode >= 300 && resp.StatusCode < 400:
			if a, ok := artifactOf(st.host, req.URL.EscapedPath()); ok {
				base, _ := url.Parse(requestKey(fc.sni != "", st.host, req.URL))
				if loc, err := base.Parse(resp.Header.Get("Location")); err == nil && resp.Header.Get("Location") != "" {
					fc.sb.redirects.put(loc.String(), a, artifactURL(req.URL.Scheme, st.host, req.URL))
				}
			}
		}
	}
	st.inBody = newCountReader(resp.Body, false)
	resp.Body = st.inBody
	return nil
}

// proxyError answers a request the gateway could not (or would not)
// complete upstream.
func (fc *flowConn) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	st := r.Context().Value(stateKey{}).(*reqState)
	var verr *tls.CertificateVerificationError
	var uerr x509.UnknownAuthorityError
	var herr x509.HostnameError
	var ierr x509.CertificateInvalidError
	switch {
	case st.leak.Load() != nil:
		st.ev.Reason = ReasonPlaceholderLeak
		refuse(w, http.StatusForbidden, st.ev.Reason)
		return
	case st.encErr || errors.Is(err, errEncoding):
		st.ev.Reason = ReasonEncoding
	case st.partial || errors.Is(err, errPartial):
		st.ev.Reason = ReasonPartial
	case errors.As(err, &verr) || errors.As(err, &uerr) || errors.As(err, &herr) || errors.As(err, &ierr):
		st.ev.Reason = ReasonUpstreamTLS
	case errors.Is(err, context.Canceled):
		st.ev.Reason = ReasonAborted
	default:
		st.ev.Reason = ReasonUpstream
	}
	fc.sb.log.Debug("gateway: upstream request failed", "host", st.host, "reason", st.ev.Reason, "err", err)
	refuse(w, http.StatusBadGateway, st.ev.Reason)
}

func (s *sandbox) secret(ctx context.Context, name string) (string, error) {
	if s.g.secrets == nil {
		return "", errors.New("gateway: no secret store")
	}
	return s.g.secrets.Value(ctx, name)
}

func (s *sandbox) request(ctx context.Context, ev Event) {
	if s.g.rec != nil {
		s.g.rec.Request(context.WithoutCancel(ctx), ev)
	}
	if !ev.Allowed {
		s.log.Debug("gateway: request refused", "host", ev.Host, "method", ev.Method, "path", ev.Path, "reason", ev.Reason, "secrets", ev.Secrets)
	}
}

func (s *sandbox) download(ctx context.Context, d Download) {
	if s.g.rec != nil {
		s.g.rec.Download(context.WithoutCancel(ctx), d)
	}
}

// splitHost splits a Host header (or :authority) into a normalised name
// or an address, without the port.
func splitHost(hostport string) (host string, isIP, ok bool) {
	h := hostport
	if sh, _, err := net.SplitHostPort(hostport); err == nil {
		h = sh
	} else if strings.HasPrefix(hostport, "[") && strings.HasSuffix(hostport, "]") {
		h = hostport[1 : len(hostport)-1]
	}
	if a, err := netip.ParseAddr(h); err == nil {
		if a.Zone() != "" {
			return "", false, false
		}
		return a.String(), true, true
	}
	n, ok := policy.NormalizeName(h)
	return n, false, ok
}

// boundTo reports whether a binding's hosts ("name" or "name:port", name
// a pattern) cover name (normalised) on port; an entry without a port
// means def (the scheme's: 443 for https, 80 for http).
func boundTo(hosts []string, name string, port, def uint16) bool {
	for _, h := range hosts {
		pat, p, ok := splitBindingHost(h)
		if !ok {
			continue
		}
		if p == 0 {
			p = def
		}
		if p == port && policy.MatchPattern(pat, name) {
			return true
		}
	}
	return false
}

// boundName reports whether a binding's hosts cover name on any port.
func boundName(hosts []string, name string) bool {
	for _, h := range hosts {
		if pat, _, ok := splitBindingHost(h); ok && policy.MatchPattern(pat, name) {
			return true
		}
	}
	return false
}

// splitBindingHost splits a binding's host entry into its normalised
// pattern and port (0 when it names none); ok is false for an entry that
// is neither "pattern" nor "pattern:port" with a port from 1 to 65535.
func splitBindingHost(h string) (pattern string, port uint16, ok bool) {
	h = strings.TrimSpace(h)
	if i := strings.LastIndexByte(h, ':'); i >= 0 {
		n, err := strconv.ParseUint(h[i+1:], 10, 16)
		if err != nil || n == 0 {
			return "", 0, false
		}
		h, port = h[:i], uint16(n)
	}
	p, err := policy.NormalizePattern(h)
	if err != nil || p == "*" {
		return "", 0, false
	}
	return p, port, true
}

// matchAny reports whether name (normalised) matches one of patterns.
func matchAny(patterns []string, name string) bool {
	for _, p := range patterns {
		if policy.MatchPattern(normPattern(p), name) {
			return true
		}
	}
	return false
}

func normPattern(p string) string {
	return strings.TrimSuffix(strings.ToLower(strings.TrimSpace(p)), ".")
}

// ruleFor picks host's rule set: an exact key beats a wildcard, and the
// longest wildcard suffix wins.
func ruleFor(rules map[string]map[string]string, host string) map[string]string {
	var best map[string]string
	bestLen := -1
	for k, rs := range rules {
		p := normPattern(k)
		if p == host {
			return rs
		}
		if strings.HasPrefix(p, "*.") && policy.MatchPattern(p, host) && len(p) > bestLen {
			best, bestLen = rs, len(p)
		}
	}
	return best
}

var secretRefRE = regexp.MustCompile(`\$\{e2b\.secrets\.([A-Za-z0-9_.\-]+)\}`)

func secretRefs(tmpl string) []string {
	var out []string
	for _, m := range secretRefRE.FindAllStringSubmatch(tmpl, -1) {
		out = appendUnique(out, m[1])
	}
	return out
}

func secretRef(name string) string { return "${e2b.secrets." + name + "}" }

func appendUnique(s []string, v string) []string {
	for _, x := range s {
		if x == v {
			return s
		}
	}
	return append(s, v)
}

// basicCred decodes "Basic base64(user:password)" to "user:password".
func basicCred(v string) (string, bool) {
	scheme, enc, ok := strings.Cut(strings.TrimSpace(v), " ")
	if !ok || !strings.EqualFold(scheme, "basic") {
		return "", false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return "", false
	}
	return string(b), true
}

// scanQuery looks for placeholder p in a raw query, as sent and
// percent-decoded. A placeholder in a key, or in a value when values are
// not allowed, is a leak; found says it sits in at least one value.
func scanQuery(raw, p string, allowed bool) (found, leak bool) {
	if raw == "" {
		return false, false
	}
	if dec, err := url.QueryUnescape(raw); !strings.Contains(raw, p) && err == nil && !strings.Contains(dec, p) {
		return false, false
	}
	for _, part := range strings.Split(raw, "&") {
		k, v, _ := strings.Cut(part, "=")
		if strings.Contains(k, p) || strings.Contains(unescapeLenient(k), p) {
			return false, true
		}
		if strings.Contains(v, p) || strings.Contains(unescapeLenient(v), p) {
			if !allowed {
				return false, true
			}
			found = true
		}
	}
	return found, false
}

// unescapeLenient percent-decodes s, keeping a malformed escape as it is.
func unescapeLenient(s string) string {
	if d, err := url.QueryUnescape(s); err == nil {
		return d
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if d, err := url.PathUnescape(s[i : i+3]); err == nil {
				b.WriteString(d)
				i += 2
				continue
			}
		}
		if s[i] == '+' {
			b.WriteByte(' ')
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// replaceQuery puts value in place of placeholder p in the query's values,
// re-escaping only the values it changes.
func replaceQuery(raw, p, value string) string {
	parts := strings.Split(raw, "&")
	for i, part := range parts {
		k, v, hasEq := strings.Cut(part, "=")
		if !hasEq {
			continue
		}
		dv := unescapeLenient(v)
		if !strings.Contains(dv, p) {
			continue
		}
		parts[i] = k + "=" + url.QueryEscape(strings.ReplaceAll(dv, p, value))
	}
	return strings.Join(parts, "&")
}

// requestKey is the absolute URL a redirect's Location is compared with.
func requestKey(tls bool, host string, u *url.URL) string {
	scheme := "http"
	if tls {
		scheme = "https"
	}
	return (&url.URL{Scheme: scheme, Host: host, Path: u.Path, RawPath: u.RawPath, RawQuery: u.RawQuery}).String()
}

// redirectMemo remembers, for a short while, where a registry sent a
// sandbox for an artifact (GitHub release assets and crates.io downloads
// redirect to a storage host), so the download is recorded under the
// package's name when the sandbox follows the redirect.
type redirectMemo struct {
	mu sync.Mutex
	m  map[string]redirectEntry
}

type redirectEntry struct {
	a   artifact
	url string // the registry URL the sandbox asked for
	exp time.Time
}

const (
	redirectMemoSize = 128
	redirectMemoTTL  = 10 * time.Minute
)

func newRedirectMemo() *redirectMemo { return &redirectMemo{m: map[string]redirectEntry{}} }

func (r *redirectMemo) put(loc string, a artifact, from string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := time.Now()
	if len(r.m) >= redirectMemoSize {
		var oldest string
		var oldestExp time.Time
		for k, e := range r.m {
			if e.exp.Before(now) {
				delete(r.m, k)
				continue
			}
			if oldest == "" || e.exp.Before(oldestExp) {
				oldest, oldestExp = k, e.exp
			}
		}
		if len(r.m) >= redirectMemoSize {
			delete(r.m, oldest)
		}
	}
	r.m[loc] = redirectEntry{a: a, url: from, exp: now.Add(redirectMemoTTL)}
}

func (r *redirectMemo) take(loc string) (artifact, string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.m[loc]
	if !ok {
		return artifact{}, "", false
	}
	delete(r.m, loc)
	return e.a, e.url, time.Now().Before(e.exp)
}

// artifactURL is the URL a download is recorded under: no query (signed
// storage URLs carry tokens in it).
func artifactURL(scheme, host string, u *url.URL) string {
	return (&url.URL{Scheme: scheme, Host: host, Path: u.Path, RawPath: u.RawPath}).String()
}
