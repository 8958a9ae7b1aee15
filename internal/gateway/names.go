package gateway

import (
	"context"
	"strings"
	"time"
)

// RefuseName implements egress.NameChecker: a DNS name that carries one
// of the sandbox's placeholders (exfiltration through the resolver) is
// refused before it reaches the upstream resolver, and recorded.
func (s *sandbox) RefuseName(name string) (string, bool) {
	c := s.cfg()
	if c == nil || len(c.Bindings) == 0 {
		return "", false
	}
	lower := strings.ToLower(name)
	for _, b := range c.Bindings {
		if b.Placeholder != "" && strings.Contains(lower, strings.ToLower(b.Placeholder)) {
			s.request(context.Background(), Event{SandboxID: s.id, Time: time.Now(), Host: name,
				Method: "DNS", Reason: ReasonPlaceholderLeak, Secrets: []string{b.Secret}})
			return ReasonPlaceholderLeak, true
		}
	}
	return "", false
}
