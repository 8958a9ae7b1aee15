package isolation

import "crypto/rand"

const idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// NewID returns a random sandbox ID in E2B's shape: 20 characters of
// [a-z0-9] from crypto/rand, every character equally likely.
func NewID() string {
	out := make([]byte, 0, 20)
	var buf [32]byte
	for len(out) < cap(out) {
		rand.Read(buf[:])
		for _, b := range buf {
			// 252 = 7*36: rejecting larger bytes keeps the letters uniform.
			if b < 252 && len(out) < cap(out) {
				out = append(out, idAlphabet[b%36])
			}
		}
	}
	return string(out)
}
