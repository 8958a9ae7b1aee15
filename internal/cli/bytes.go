package cli

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// parseBytes reads a size: a number of bytes, or one with a KiB, MiB,
// GiB or TiB suffix (KB, MB, GB, TB and K, M, G, T mean the same).
func parseBytes(s string) (int64, error) {
	num, mult := strings.TrimSpace(s), int64(1)
	units := []struct {
		suffix string
		mult   int64
	}{
		{"TiB", 1 << 40}, {"TB", 1 << 40}, {"T", 1 << 40}, {"GiB", 1 << 30}, {"GB", 1 << 30}, {"G", 1 << 30},
		{"MiB", 1 << 20}, {"MB", 1 << 20}, {"M", 1 << 20}, {"KiB", 1 << 10}, {"KB", 1 << 10}, {"K", 1 << 10},
	}
	for _, u := range units {
		if v, ok := strings.CutSuffix(num, u.suffix); ok {
			num, mult = strings.TrimSpace(v), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	return n * mult, nil
}
