package cli

import (
	"bytes"
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fencesandbox/fence/client"
	"github.com/fencesandbox/fence/internal/approvals"
	"github.com/fencesandbox/fence/internal/httpapi"
)

// answerApprovals asks about each request as it arrives and sends the
// answer: y is once, s is sandbox, n is deny.
func TestAnswerApprovals(t *testing.T) {
	q := approvals.New(approvals.Options{})
	srv := httptest.NewServer(httpapi.New(httpapi.Options{APIKey: "k", Approvals: q}))
	defer srv.Close()
	got := make(chan approvals.Decision, 2)
	for _, n := range []string{"a.test", "b.test"} {
		go func() {
			d, _ := q.Ask(context.Background(), "sbx1", "", n)
			got <- d
		}()
	}
	for len(q.List(nil)) < 2 {
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out bytes.Buffer
	errc := make(chan error, 1)
	go func() {
		errc <- answerApprovals(ctx, client.New(srv.URL, "k"), strings.NewReader("y\nn\n"), &out, time.Millisecond)
	}()
	ds := []approvals.Decision{<-got, <-got}
	cancel() // it waits for more requests until interrupted
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if !(ds[0] == approvals.Once && ds[1] == approvals.Deny || ds[0] == approvals.Deny && ds[1] == approvals.Once) {
		t.Fatalf("decisions %v, output %q", ds, out.String())
	}
	if !strings.Contains(out.String(), "wants to reach a.test") {
		t.Fatalf("output %q", out.String())
	}
}
