package process

import (
	"sync"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	pb "github.com/fencesandbox/fence/api/envd/process"
)

// TestWarmCodecsBesideRequests: the warm-up may run while requests decode
// and encode the same messages (go test -race checks it).
func TestWarmCodecsBesideRequests(t *testing.T) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); WarmCodecs() }()
	go func() {
		defer wg.Done()
		var req pb.StartRequest
		if err := protojson.Unmarshal([]byte(`{"process":{"cmd":"/bin/true","args":["x"]},"stdin":false}`), &req); err != nil {
			t.Error(err)
			return
		}
		if req.GetProcess().GetCmd() != "/bin/true" || req.GetStdin() {
			t.Errorf("decoded %v", &req)
		}
	}()
	wg.Wait()
	WarmCodecs()
}
