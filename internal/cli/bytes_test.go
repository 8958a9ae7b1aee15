package cli

import "testing"

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "1024": 1024, "2GiB": 2 << 30, "500MiB": 500 << 20, "1 G": 1 << 30, "3K": 3 << 10} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "-1", "1.5G", "x", "99999999999TiB"} {
		if _, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) accepted", in)
		}
	}
}
