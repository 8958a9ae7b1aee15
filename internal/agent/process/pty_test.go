package process

import "testing"

func TestOpenPTMXFallsBack(t *testing.T) {
	saved := ptmxPaths
	defer func() { ptmxPaths = saved }()
	ptmxPaths = []string{t.TempDir() + "/missing-ptmx", "/dev/ptmx"}
	f, err := openPTMX()
	if err != nil {
		t.Fatalf("openPTMX() with a missing first path = %v, want the next one opened", err)
	}
	f.Close()
}
