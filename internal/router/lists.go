package router

// Lists and /metrics through the router: every live node's answer,
// merged (v2 lists keep E2B's pagination across nodes; each /metrics
// sample is labelled with its node).

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/fencesandbox/fence/api"
)

// listed is the part of a listed sandbox the merge needs; the rest is
// passed through as the node wrote it.
type listed struct {
	raw       json.RawMessage
	id        string
	startedAt time.Time
}

// gather merges the lists of every node; a node's error answer (a bad
// query, answered alike by all) is returned as is.
func (rt *Router) gather(w http.ResponseWriter, r *http.Request) ([]listed, bool, bool) {
	var all []listed
	more := false
	for _, a := range rt.fanOut(r) {
		if a.err != nil {
			// A node failing now is dead within its lease; its sandboxes
			// are gone from the list meanwhile.
			rt.log.Warn("list: node did not answer", "node", a.node.Name, "err", a.err)
			continue
		}
		if a.status != http.StatusOK {
			copyHeader(w.Header(), a.header)
			w.WriteHeader(a.status)
			w.Write(a.body)
			return nil, false, false
		}
		var items []json.RawMessage
		if err := json.Unmarshal(a.body, &items); err != nil {
			rt.log.Warn("list: bad answer from node", "node", a.node.Name, "err", err)
			continue
		}
		for _, it := range items {
			var s struct {
				ID        string    `json:"sandboxID"`
				StartedAt time.Time `json:"startedAt"`
			}
			if json.Unmarshal(it, &s) == nil {
				all = append(all, listed{raw: it, id: s.ID, startedAt: s.StartedAt})
			}
		}
		if a.header.Get(api.HeaderNextToken) != "" {
			more = true
		}
	}
	return all, more, true
}

func (rt *Router) listV1(w http.ResponseWriter, r *http.Request) {
	all, _, ok := rt.gather(w, r)
	if !ok {
		return
	}
	sortListed(all, false)
	writeList(w, all)
}

// listV2 keeps E2B's pagination across nodes: every node lists from the
// same cursor (a position in the common order: start time, then ID), the
// router keeps the first limit of the merge, and the cursor of the last one
// kept is the next token.
func (rt *Router) listV2(w http.ResponseWriter, r *http.Request) {
	all, more, ok := rt.gather(w, r)
	if !ok {
		return
	}
	asc := r.URL.Query().Get("order") == "asc"
	sortListed(all, asc)
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		if n, err := parseLimit(v); err == nil {
			limit = n
		}
	}
	if len(all) > limit {
		all, more = all[:limit], true
	}
	if more && len(all) > 0 {
		last := all[len(all)-1]
		w.Header().Set(api.HeaderNextToken, api.PageToken(last.startedAt, last.id))
	}
	writeList(w, all)
}

func parseLimit(v string) (int, error) {
	n := 0
	for _, c := range v {
		if c < '0' || c > '9' || n > 1e6 {
			return 0, errors.New("bad limit")
		}
		n = n*10 + int(c-'0')
	}
	if n < 1 {
		return 0, errors.New("bad limit")
	}
	return n, nil
}

// sortListed orders like a node's store: newest first (start time, then
// ID, both descending), or oldest first with asc.
func sortListed(all []listed, asc bool) {
	slices.SortFunc(all, func(a, b listed) int {
		c := a.startedAt.Compare(b.startedAt)
		if c == 0 {
			c = strings.Compare(a.id, b.id)
		}
		if !asc {
			c = -c
		}
		return c
	})
}

func writeList(w http.ResponseWriter, all []listed) {
	items := make([]json.RawMessage, len(all))
	for i, l := range all {
		items[i] = l.raw
	}
	writeJSON(w, http.StatusOK, items)
}

// metrics concatenates the nodes' Prometheus expositions, each sample
// labelled with its node.
func (rt *Router) metrics(w http.ResponseWriter, r *http.Request) {
	var buf bytes.Buffer
	seen := map[string]bool{}
	for _, a := range rt.fanOut(r) {
		if a.err != nil || a.status != http.StatusOK {
			if a.status == http.StatusUnauthorized {
				writeErr(w, http.StatusUnauthorized, "invalid API key")
				return
			}
			continue
		}
		for line := range strings.Lines(string(a.body)) {
			line = strings.TrimRight(line, "\n")
			if line == "" {
				continue
			}
			if strings.HasPrefix(line, "#") {
				if !seen[line] {
					seen[line] = true
					buf.WriteString(line + "\n")
				}
				continue
			}
			buf.WriteString(labelSample(line, a.node.Name) + "\n")
		}
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	w.Write(buf.Bytes())
}

// labelSample adds node="name" to one sample line of the text exposition.
func labelSample(line, node string) string {
	lbl := `node="` + node + `"`
	if i := strings.IndexByte(line, '{'); i >= 0 && i < strings.IndexByte(line, ' ') {
		if strings.HasPrefix(line[i+1:], "}") {
			return line[:i+1] + lbl + line[i+1:]
		}
		return line[:i+1] + lbl + "," + line[i+1:]
	}
	name, rest, _ := strings.Cut(line, " ")
	return name + "{" + lbl + "} " + rest
}
